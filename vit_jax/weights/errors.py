"""The one error of a parameter file: unreadable, or not fitting the model."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or does not fit the model."""
