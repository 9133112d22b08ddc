"""The language-model family (Table 5: character-level GPT-2 pretraining): ``table5_gpt2`` (presets, cells,
training) and ``table5_report``."""
