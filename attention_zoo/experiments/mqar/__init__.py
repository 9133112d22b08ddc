"""MQAR (multi-query associative recall, Zoology) for all seven variants and the controls: a capability ladder and
the DCFormer in-context claim (docs/experiments.md §11)."""
