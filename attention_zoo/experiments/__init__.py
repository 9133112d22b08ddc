"""One module per table/figure: presets, the grid of cells, the per-cell function, the paper's numbers."""
