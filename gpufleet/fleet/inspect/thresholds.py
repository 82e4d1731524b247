"""Per-SKU inspection thresholds: thresholds.yaml (each number with its source), validated."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpufleet.config.accelerators import AcceleratorModel
from gpufleet.core.errors import InputError, Problem, format_path

THRESHOLDS_FILE = Path(__file__).with_name("thresholds.yaml")


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Sourced(_M):
    value: float
    source: Annotated[str, Field(min_length=10)]


class Defaults(_M):
    perf_floor_percent: Sourced = Field(alias="perfFloorPercent")
    max_link_flaps: Sourced = Field(alias="maxLinkFlaps")
    ecc_row_remap_pending_max: Sourced = Field(alias="eccRowRemapPendingMax")
    ecc_row_remap_failed_max: Sourced = Field(alias="eccRowRemapFailedMax")
    ecc_uncorrectable_remapped_rows_max: Sourced = Field(alias="eccUncorrectableRemappedRowsMax")
    ecc_uncorrectable_volatile_max: Sourced = Field(alias="eccUncorrectableVolatileMax")
    ecc_correctable_volatile_max: Sourced = Field(alias="eccCorrectableVolatileMax")


class SkuThresholds(_M):
    pcie_gen: Sourced | None = Field(default=None, alias="pcieGen")
    pcie_width: Sourced | None = Field(default=None, alias="pcieWidth")
    # Reference figures of the SKU's acceptance tests, by metric name; a metric without one is
    # judged against the pool's own reference (the median of the sweep: reference.py).
    perf: dict[str, Sourced] = Field(default_factory=dict)


class Thresholds(_M):
    defaults: Defaults
    skus: dict[AcceleratorModel, SkuThresholds]

    def sku(self, model: AcceleratorModel) -> SkuThresholds:
        return self.skus.get(model, SkuThresholds())


def parse_thresholds(doc: object, where: str) -> Thresholds:
    try:
        return Thresholds.model_validate(doc)
    except ValidationError as e:
        raise InputError(where, [Problem(format_path(err["loc"]), err["msg"])
                                 for err in e.errors()]) from None


@cache
def load_thresholds(path: Path = THRESHOLDS_FILE) -> Thresholds:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise InputError(str(path), [Problem("(file)", str(e))]) from None
    return parse_thresholds(doc, str(path))
