"""The clock controller: each instruction's clock issued ahead so that it is in effect when the
instruction starts."""
