"""The masked character LM (bidirectional) and its sweeps: THA's, MoA's and MMA's claims and ColMHA's key-size
sweep (issue 55)."""
