"""Data: synthetic tasks, text corpora and image sets; real loaders plus embedded offline defaults."""
