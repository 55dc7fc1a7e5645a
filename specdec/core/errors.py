"""Errors that name what the caller got wrong.

The gRPC servers map `InvalidArgument` to INVALID_ARGUMENT with `field` in the message, so the
same check gives the same answer in-process, over the wire and from the CLI.
"""


class InvalidArgument(ValueError):
    """A request field has a value the system refuses; `field` uses the proto's dotted path."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class NonFiniteLogits(FloatingPointError):
    """A target pass gave NaN or infinite logits at some positions: no token is the argmax there.
    A broken checkpoint or an overflow in the model, never a request's fault."""

    def __init__(self, rows: list[int]):
        super().__init__(f"the target's logits hold NaN or inf at positions {rows} of the pass: no argmax to decode")
        self.rows = rows
