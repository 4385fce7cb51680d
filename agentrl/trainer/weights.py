"""What a learner hands to whoever copies its weights out (the Laminar relay's push, an evaluation
engine): views of its parameters where it offers them, else a clone."""

from __future__ import annotations

from typing import Any


def weight_views(learner: Any) -> dict[str, Any]:
    """The learner's weights as views where it offers them (`state_dict_views`; valid until its
    next step: a push copies them into a relay buffer first, an evaluation runs between steps);
    a clone (`state_dict_for_inference`) otherwise."""
    return getattr(learner, "state_dict_views", learner.state_dict_for_inference)()
