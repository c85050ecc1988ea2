"""What ``help()`` and IDEs show of the models users write: their fields, described."""

from __future__ import annotations

import inspect
import pydoc
import re

import pytest
from pydantic import BaseModel

from lowmark.batches.config import descriptions
from lowmark.batches.pipeline import SOURCE_MODELS, CustomSink, DeltaSink, Pipeline
from lowmark.batches.windows import EventTime, Session, Sliding, Tumbling, WindowedAggregation

USER_MODELS = (Pipeline, *SOURCE_MODELS, DeltaSink, CustomSink, EventTime, WindowedAggregation)


@pytest.mark.parametrize(
    "model", [*USER_MODELS, Tumbling, Sliding, Session], ids=lambda m: m.__name__
)
def test_help_shows_every_field_with_its_description_near_the_top(model: type[BaseModel]) -> None:
    shown = re.sub(".\b", "", pydoc.render_doc(model))  # without the bold of a terminal
    top = shown[: shown.index("Method resolution order")]
    flat = " ".join(top.replace("|", " ").split())
    assert model.__doc__ is not None and len(model.__doc__.splitlines()) < 120
    for name, description in descriptions(model).items():
        assert description, f"{model.__name__}.{name} has no description"
        assert f"{name} (" in flat and " ".join(description.split()) in flat, name
    # The signature names the keys, not pydantic's annotations.
    assert "Annotated" not in top and "Discriminator" not in top


def test_the_signature_shows_the_keys_with_their_python_defaults() -> None:
    shown = str(inspect.signature(Pipeline))
    assert shown.startswith(
        "(*, name, description='', source, transform=None, joins=(), expectations=(), "
    )
    assert "checks=HealthChecks()" in shown and "max_failed_attempts=3" in shown
    assert str(inspect.signature(EventTime)).endswith(
        "max_future='1 day', watermark=None, admission='fair')"
    )
