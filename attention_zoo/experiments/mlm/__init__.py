"""The masked character LM (bidirectional) and its sweeps: THA's, MoA's and MMA's claims and ColMHA's key-size
sweep (docs/experiments.md §11)."""
