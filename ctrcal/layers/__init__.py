"""Building blocks other CTR models import: norms (one registry), MC-LayerNorm, MaskBlock."""
