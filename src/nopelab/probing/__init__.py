"""Position probes, the signal verdict, and causal interventions."""
