"""EAGLE drafting: the draft head (head.py), its KV pool, the EAGLE-2 tree search, the drafter."""
