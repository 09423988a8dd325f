"""The reference solution of lab 7, exercise 7.4 (for the tests; fornax lab never prints it):
the matmuls (and tanh) in bfloat16; the residual stream and the loss in float32, where a
small difference of large numbers must survive."""

POLICY = {
    "fc1": "bfloat16",
    "act": "bfloat16",
    "fc2": "bfloat16",
    "residual": "float32",
    "loss": "float32",
}
