"""Pydantic models of the custom resources' specs and status.

The one source of the CRD schemas in ``crds/``. Pure data: imports nothing else of ours and
talks to nothing.
"""

__all__: list[str] = []
