"""The runtime's store wrappers derive from one explicit delegating base (issue 22, item 2):
every port method is written out there, a wrapper overrides only what it changes, and none
reaches the adapter through ``__getattr__``."""

from __future__ import annotations

import inspect
import random

import pytest

from workledger._runtime.broker.delivery import FollowUps
from workledger._runtime.broker.dispatch import DispatchingStore
from workledger._runtime.patience import Patience, PatientStore, patient
from workledger.storage.delegate import DelegatingStore
from workledger.storage.port import NewRun, Store

pytestmark = pytest.mark.contract

WRAPPERS = (PatientStore, DispatchingStore, FollowUps)


def port_methods() -> set[str]:
    return {name for name, member in vars(Store).items()
            if inspect.isfunction(member) and not name.startswith("_")}


def test_every_port_method_is_written_out_in_the_delegating_base() -> None:
    written = {name for name, member in vars(DelegatingStore).items()
               if inspect.isfunction(member)}
    assert port_methods() - written == set()
    for wrapper in WRAPPERS:
        assert issubclass(wrapper, DelegatingStore), wrapper
        assert not any("__getattr__" in vars(k) for k in wrapper.__mro__
                       if k is not object), wrapper


def test_a_delegated_call_reaches_the_adapter_and_returns_its_answer(store: Store) -> None:
    wrapped = patient(DispatchingStore(store, outbox=None),  # type: ignore[arg-type]
                      Patience(5.0, rng=random.Random(1)))
    run, created = wrapped.run_submit(NewRun("job", "k1", '{"n": 1}'))
    assert created and wrapped.run_get(run.id) == store.run_get(run.id)
    assert wrapped.dialect == store.dialect
    assert wrapped.wakes_other_processes == store.wakes_other_processes
    assert isinstance(wrapped, DelegatingStore) and wrapped.innermost() is store
    assert patient(wrapped, Patience(1.0)) is wrapped  # already patient: not wrapped again


def test_patience_tells_the_adapter_how_long_to_wait_for_a_commit_in_doubt_under_any_wrapper(
    store: Store,
) -> None:
    """Through ``__getattr__`` the setting landed on the outer wrapper, never on a PostgreSQL
    adapter under a DispatchingStore: a lost COMMIT's outcome was waited for by the default."""
    if not hasattr(store, "doubt_for"):
        pytest.skip("only PostgreSQL can lose a COMMIT's acknowledgement")
    patient(DispatchingStore(store, outbox=None),  # type: ignore[arg-type]
            Patience(123.0, rng=random.Random(1)))
    assert store.doubt_for == 123.0  # type: ignore[attr-defined]
