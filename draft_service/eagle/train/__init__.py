"""Training an EAGLE draft head by self-distillation from the target (see README in heads/)."""
