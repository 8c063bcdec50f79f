"""One way to address a site, whatever built the model.

A site is named as the user types it (``embed``, ``attn_heads``, ``attn_out``, ``resid_mid``,
``mlp_out``, ``resid_post``), with one layer numbering: ``embed`` is layer 0, blocks are 1..L.
:class:`Sites` is the interface that the statistics, the probes and the interventions use:

* ``site_keys(sites)``: the (site, layer) pairs the model has for the requested sites;
* ``observe(keys, fn)``: every forward pass calls ``fn(key, activation)`` with (B, T, d);
* ``edit(key, fn)``: every forward pass replaces the activation at ``key`` by ``fn(activation)``.

Hooks run in the order they were added: an observer added after an edit sees the edited
activation, one added before it sees the original (add edits first).

Three kinds of model have it: native models (:class:`NativeSites`, their hook points), Hugging
Face models (:class:`nopelab.hf.sites.HFModel`, mapped per architecture), and any other
``nn.Module`` whose sites are modules that output the activation (:class:`ModuleSites`, plain
forward hooks).

>>> from torch import nn
>>> layers = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
>>> sites = ModuleSites({("resid_post", 1): layers[0], ("resid_post", 2): layers[1]})
>>> sites.site_keys(["resid_post"])
[('resid_post', 1), ('resid_post', 2)]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from operator import attrgetter
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from nopelab.config import BLOCK_SITES, DEFAULT_SITES, SITES
from nopelab.models.transformer import Transformer

if TYPE_CHECKING:
    from nopelab.hf.sites import HFModel

SiteKey = tuple[str, int]  # (site, layer)
Observer = Callable[[SiteKey, Tensor], None]
Edit = Callable[[Tensor], Tensor]


@runtime_checkable
class Sites(Protocol):
    """Where a model's activations can be read and replaced, by nopelab's site names."""

    def site_keys(self, sites: Iterable[str] = DEFAULT_SITES) -> list[SiteKey]:
        """Every (site, layer) of the model for the requested sites, in model order."""
        ...

    def observe(self, keys: Iterable[SiteKey], fn: Observer) -> list[RemovableHandle]:
        """Hook ``keys`` so that every forward pass calls ``fn(key, activation)``."""
        ...

    def edit(self, key: SiteKey, fn: Edit) -> RemovableHandle:
        """Hook ``key`` so that every forward pass replaces its activation ``h`` by ``fn(h)``."""
        ...


def check_site_names(sites: Iterable[str]) -> list[str]:
    """``sites`` as a list; a ValueError naming the allowed sites for an unknown one."""
    sites = list(sites)
    for site in sites:
        if site not in SITES:
            raise ValueError(f"unknown site {site!r}; allowed: {', '.join(SITES)}")
    return sites


def in_model_order(keys: Iterable[SiteKey]) -> list[SiteKey]:
    """``keys`` sorted by layer, then by the sites' order within a block."""
    return sorted(keys, key=lambda key: (key[1], SITES.index(key[0])))


def first_tensor(output: Tensor | tuple) -> Tensor:
    """A module's output tensor, or the first element of its output tuple."""
    return output[0] if isinstance(output, tuple) else output


def replace_first(output: Tensor | tuple, value: Tensor) -> Tensor | tuple:
    """``output`` with :func:`first_tensor`'s tensor replaced by ``value``."""
    return (value, *output[1:]) if isinstance(output, tuple) else value


class ModuleSites:
    """Sites given as ``{(site, layer): module}``, each module's output (or the first element of
    an output tuple) being the activation; observed and edited through plain forward hooks."""

    def __init__(self, modules: Mapping[SiteKey, nn.Module]):
        for site, layer in modules:
            check_site_names([site])
            if (site == "embed") != (layer == 0) or layer < 0:
                raise ValueError(
                    f"site {site!r} at layer {layer}: embed is layer 0, the blocks' sites 1..L"
                )
        self.modules = {key: modules[key] for key in in_model_order(modules)}

    def site_keys(self, sites: Iterable[str] = DEFAULT_SITES) -> list[SiteKey]:
        wanted = check_site_names(sites)
        have = {site for site, _ in self.modules}
        if missing := [site for site in wanted if site not in have]:
            raise ValueError(
                f"no module is named as site {', '.join(missing)}; the sites given: "
                f"{', '.join(dict.fromkeys(site for site, _ in self.modules))}"
            )
        return [key for key in self.modules if key[0] in wanted]

    def _module(self, key: SiteKey) -> nn.Module:
        if key not in self.modules:
            have = ", ".join(f"{site} {layer}" for site, layer in self.modules)
            raise ValueError(f"no site {key[0]} at layer {key[1]}; the model has: {have}")
        return self.modules[key]

    def observe(self, keys: Iterable[SiteKey], fn: Observer) -> list[RemovableHandle]:
        def hook(key: SiteKey):
            return lambda module, inputs, output: fn(key, first_tensor(output))

        modules = {key: self._module(key) for key in keys}  # every key checked before hooking
        return [module.register_forward_hook(hook(key)) for key, module in modules.items()]

    def edit(self, key: SiteKey, fn: Edit) -> RemovableHandle:
        def hook(module: nn.Module, inputs: tuple, output: Tensor | tuple) -> Tensor | tuple:
            return replace_first(output, fn(first_tensor(output)))

        return self._module(key).register_forward_hook(hook)


def site_modules(
    model: Transformer, sites: Iterable[str] = DEFAULT_SITES
) -> dict[SiteKey, nn.Module]:
    """The hook point of every requested site of a native model, keyed by (site, layer)."""
    modules: dict[SiteKey, nn.Module] = {}
    for site in check_site_names(sites):
        if site == "embed":
            modules[("embed", 0)] = model.hook_embed
        elif site in BLOCK_SITES:
            hook = attrgetter("attn.hook_heads" if site == "attn_heads" else f"hook_{site}")
            for layer, block in enumerate(model.blocks, start=1):
                modules[(site, layer)] = hook(block)
    return {key: modules[key] for key in in_model_order(modules)}


class NativeSites(ModuleSites):
    """A native model's sites: its hook points (``hook_embed``, ``blocks[i].hook_attn_out``, ...)."""

    def __init__(self, model: Transformer):
        super().__init__(site_modules(model, SITES))


def sites_of(model: Transformer | HFModel | Sites) -> Sites:
    """The :class:`Sites` of a native model, a Hugging Face model, or a given :class:`Sites`."""
    if isinstance(model, Transformer):
        return NativeSites(model)
    if isinstance(model, Sites):
        return model
    raise TypeError(
        f"{type(model).__name__} has no nopelab sites: wrap it in ModuleSites({{(site, layer): "
        "module}}) to name the modules whose outputs are its activations"
    )
