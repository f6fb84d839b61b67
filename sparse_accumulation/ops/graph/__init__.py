"""Message passing: the sparse accumulation of a channel rule with gathered operand rows and summed output rows,
fused."""
