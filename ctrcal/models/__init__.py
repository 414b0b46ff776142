"""Pure CTR models: ``nn.Module``s that map a batch to logits and know nothing else."""
