"""The erasure steps take a typed warehouse (issue 34 item 3): every function of
``pipelines.store.forget_apply`` that receives the open warehouse is annotated with
:class:`pipelines.store.handle.WarehouseHandle`, and the real handle satisfies that protocol."""
from __future__ import annotations

import inspect
import typing

from pipelines.store import forget_apply
from pipelines.store.handle import WarehouseHandle
from pipelines.store.warehouse import Warehouse


def test_forget_apply_takes_a_typed_warehouse():
    takes_w = [f for _, f in inspect.getmembers(forget_apply, inspect.isfunction)
               if f.__module__ == forget_apply.__name__ and "w" in inspect.signature(f).parameters]
    assert {f.__name__ for f in takes_w} >= {"apply_erasure", "complete_pending", "ledger_result",
                                             "write_ledger_result"}
    for f in takes_w:
        assert typing.get_type_hints(f)["w"] is WarehouseHandle, f.__name__


def test_the_warehouse_handle_satisfies_the_protocol(tmp_path):
    w = Warehouse(tmp_path / "decoy.duckdb", keys=object(), ledger=object())
    assert isinstance(w, WarehouseHandle)
    members = {n for n in vars(WarehouseHandle) if not n.startswith("_")} | set(WarehouseHandle.__annotations__)
    assert members <= set(dir(w))
