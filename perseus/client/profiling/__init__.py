"""Online profiling: a rank measures its own stage's time and energy per instruction and clock."""
