"""The error of a rank asked to use weights it does not hold (weight_sync.py; the
stage calls of rollout and inference ranks). No torch: the workers raise it before any
engine work, and the controller's modules import those workers."""


class StaleWeights(RuntimeError):
    """A weight update whose version is not newer than the receiver's, or a stage that
    needs a version the rank does not hold."""
