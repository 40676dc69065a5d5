"""Image inputs: preprocessing that turns decoded images into vision-encoder tensors and prompt tokens."""
