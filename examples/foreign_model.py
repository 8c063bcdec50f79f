"""nopelab's streaming statistics on a model it did not build: PyTorch's own Transformer encoder
(pre-LN), made causal by its mask, with no positional encoding, fed N(0, 1) input vectors.

Run: ``.venv/bin/python examples/foreign_model.py``. Name the modules whose outputs are the
activations as nopelab's sites (each block's attention module as ``attn_out``, the block as
``resid_post``), and every forward pass inside the ``with`` block folds its batch into the
statistics: nothing is stored per token.
"""

import torch
from torch import nn

from nopelab.measure.capture import StreamingCapture
from nopelab.measure.sites import ModuleSites

torch.manual_seed(0)
T, D, LAYERS = 64, 64, 4
layer = nn.TransformerEncoderLayer(
    D, nhead=4, dim_feedforward=4 * D, dropout=0.0, batch_first=True, norm_first=True
)
encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False).eval()
causal = nn.Transformer.generate_square_subsequent_mask(T)

modules = {}
for i, block in enumerate(encoder.layers, start=1):
    modules[("attn_out", i)] = block.self_attn  # returns (output, weights): the output is read
    modules[("resid_post", i)] = block
sites = ModuleSites(modules)
with torch.no_grad(), StreamingCapture(sites, ["attn_out", "resid_post"], seq_len=T) as capture:
    for _ in range(8):  # 8 batches of 4 random input sequences
        encoder(torch.randn(4, T, D), mask=causal, is_causal=True)

print("site        layer  variance at 1 / at T  adjacency score (mean of 32 sequences)")
for (site, layer_number), stats in capture.result().sites.items():
    ratio = stats.variance[0] / stats.variance[-1]
    print(f"{site:10s}  {layer_number:5d}  {ratio:20.1f}  {stats.adjacency.mean:.3f}")
