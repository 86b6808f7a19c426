"""Parts of a study result (dashboards/SCHEMA.md) shared by :mod:`dashboards.schema`: strict nested
objects, claims with their status decided on an interval, and tolerances.

A claim written by a study (``evaluation.claims.claim``) carries ``status`` ∈ :data:`CLAIM_STATUSES`
with a ``reason``, the paper's figure, this run's figure with its interval and the peer's; its
``holds`` must equal ``status == "holds"``. A tolerance says how far a figure may move on another
machine (``abs`` / ``rel`` / ``decades`` / ``bound``, with ``why``).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator
from pydantic_core import PydanticCustomError

Number = Annotated[StrictInt | StrictFloat, Field(allow_inf_nan=False)]
Count = Annotated[StrictInt, Field(ge=0)]


def absent() -> Any:
    """The default of an optional field that must not be ``null`` when given (pydantic does not
    validate defaults, so an absent field passes and an explicit ``null`` is refused)."""
    return Field(default=None)


def bad_value(message: str) -> PydanticCustomError:
    return PydanticCustomError("forgetful", message)


class Part(BaseModel):
    """A nested object: strict types, extra (presentation) keys allowed."""

    model_config = ConfigDict(strict=True, extra="allow")


#: a claim's status (evaluation.claims.STATUSES): it holds only on an interval, never on a point gap
CLAIM_STATUSES = ("holds", "does not hold", "not run at the paper's protocol")
MaybeNumber = Number | None


class Measured(Part):
    """A figure with its interval (a claim's ``run``, ``peer``, ``strongest_peer``, ``difference``)."""

    value: MaybeNumber | StrictStr | StrictBool = None
    low: MaybeNumber = None
    high: MaybeNumber = None
    name: StrictStr = absent()
    interval: StrictStr = absent()
    n: Count = absent()

    @model_validator(mode="after")
    def _ordered(self) -> Measured:
        if self.low is not None and self.high is not None and self.low > self.high:
            raise bad_value("low must not exceed high")
        return self


class PaperFigure(Part):
    figure: StrictStr | None = None
    source: StrictStr = absent()


class LowPower(Part):
    flag: StrictBool
    n: Count
    unit: StrictStr
    minimum: Count = absent()
    label: StrictStr = absent()


class Claim(Part):
    statement: StrictStr
    reference: StrictStr
    path: StrictStr
    holds: StrictBool = absent()
    operation: StrictStr = absent()
    status: Literal[CLAIM_STATUSES] = absent()  # type: ignore[valid-type]
    reason: StrictStr = absent()
    rule: StrictStr = absent()
    paper: PaperFigure = absent()
    run: Measured = absent()
    peer: Measured | None = None
    strongest_peer: Measured = absent()
    difference: Measured = absent()
    low_power: LowPower = absent()
    #: false when the deciding end of the interval lies within the figure's tolerance of the threshold
    status_stable: StrictBool = absent()

    @model_validator(mode="before")
    @classmethod
    def _named(cls, v: Any) -> Any:
        for key in ("statement", "reference", "path"):
            if isinstance(v, Mapping) and not (isinstance(v.get(key), str) and v[key].strip()):
                raise bad_value(f"{key}: every claim must name its statement, reference state and numerical path")
        return v

    @model_validator(mode="after")
    def _status(self) -> Claim:
        if self.status is None:
            return self
        if not (self.reason and self.reason.strip()):
            raise bad_value("reason: a claim with a status must say why")
        if self.run is None or self.paper is None:
            raise bad_value("a claim with a status must give this run's figure (run) and the paper's (paper)")
        if self.holds is not None and self.holds != (self.status == "holds"):
            raise bad_value(f"holds: must be {self.status == 'holds'} for status {self.status!r}")
        return self


class Tolerance(Part):
    """How far a figure may move on another machine (``dashboards.reproduce --check`` enforces it)."""

    why: StrictStr
    abs: Annotated[Number, Field(ge=0)] = absent()
    rel: Annotated[Number, Field(ge=0)] = absent()
    decades: Annotated[Number, Field(ge=0)] = absent()
    bound: Annotated[Number, Field(gt=0)] = absent()

    @model_validator(mode="after")
    def _some(self) -> Tolerance:
        if not ({"abs", "rel", "decades", "bound"} & self.model_fields_set):
            raise bad_value("a tolerance needs abs, rel, decades or bound")
        return self
