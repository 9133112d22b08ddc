"""The vision family (Table 6: ViT classification): ``presets`` (models and recipes), ``table6_data`` (image sets,
loss, top-k evaluation), ``table6_vit`` (cells, training) and ``table6_report``."""
