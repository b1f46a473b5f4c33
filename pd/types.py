"""Shared jaxtyping aliases."""

from jaxtyping import Array, Bool, Float, Key

PRNGKey = Key[Array, ""]
Scalar = Float[Array, ""]
# Toy targets have one leading axis `batch`; language models have `batch seq`.
Acts = Float[Array, "*leading d"]
Mask = Float[Array, "*leading C"]
Route = Bool[Array, "*leading"]

__all__ = ["Acts", "Array", "Bool", "Float", "Key", "Mask", "PRNGKey", "Route", "Scalar"]
