"""The vision family (Table 6: ViT classification): ``table6_vit`` (cells, training), ``table6_data`` (image sets,
loss, top-k evaluation) and ``table6_report``."""
