"""Tenants and fair shares (issue 25, part 4): ``submit(..., tenant=)``, ``set_tenant_weight``,
and the claim order they give: among the runs of one priority, claims rotate across the
tenants with claimable work, each tenant's share in proportion to its weight, and across a
tenant's own runs in turn; runs without a tenant share the default tenant.

The port on both backends first; then the facade, the CLI and HTTP; then worker processes.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_cli import cli_cmd, cli_env
from test_contract_store import insert
from waiting import poll

from workledger import Item, Ledger
from workledger.errors import BadInput
from workledger.storage.port import NewRun, Store

JOB = "ingest"


def _run(store: Store, key: str, tenant: str | None = None, priority: int = 0) -> int:
    run, created = store.run_submit(NewRun(JOB, key, json.dumps({"key": key}),
                                           priority=priority, tenant=tenant))
    assert created
    insert(store, run.id, range(3))
    store.run_mark_decomposed(run.id, "generate")
    return run.id


# -- the port, on both backends ----------------------------------------------------------------


@pytest.mark.contract
def test_a_run_keeps_its_tenant_and_lists_with_its_tenants_weight(store: Store) -> None:
    plain = _run(store, "plain")
    acme = _run(store, "acme-1", tenant="acme")
    globex = _run(store, "globex-1", tenant="globex")
    got = store.runs_claimable([JOB])
    assert [(r.id, r.tenant, r.weight) for r in got] == [
        (plain, None, 1), (acme, "acme", 1), (globex, "globex", 1)]
    assert store.tenant_set_weight("acme", 3, "alice", "enterprise plan") is True
    assert store.tenant_set_weight("acme", 3, "bob", None) is False  # no change
    assert store.tenant_set_weight("default", 2, "alice", None) is True
    got = store.runs_claimable([JOB])
    assert [(r.id, r.weight) for r in got] == [(plain, 2), (acme, 3), (globex, 1)]
    rows = store.tenants_list()
    assert [(t.name, t.weight, t.updated_by, t.note) for t in rows] == [
        ("acme", 3, "alice", "enterprise plan"), ("default", 2, "alice", None)]
    run = store.run_get(acme)
    assert run is not None and run.tenant == "acme"


@pytest.mark.contract
def test_runs_of_one_tenant_are_listed_and_counted_alone(store: Store) -> None:
    plain = _run(store, "plain")
    a1 = _run(store, "a1", tenant="acme")
    _run(store, "g1", tenant="globex")
    a2 = _run(store, "a2", tenant="acme")
    assert [r.id for r in store.runs_list(10, None, "acme")] == [a2, a1]
    assert store.runs_count(None, "acme") == 2
    assert [r.id for r in store.runs_list(10, a2, "acme")] == [a1]
    assert [r.id for r in store.runs_list(10, None, "default")] == [plain]
    assert store.runs_count(None, "nobody") == 0
    assert len(store.runs_list(10)) == 4


@pytest.mark.contract
def test_a_weight_outside_one_to_a_thousand_is_refused_by_the_schema_too(store: Store) -> None:
    from workledger.errors import StorageError

    with pytest.raises(StorageError):
        store.tenant_set_weight("acme", 0, "alice", None)
    assert store.tenants_list() == []


# -- the facade --------------------------------------------------------------------------------


def _ledger(url: str, seen: list[int] | None = None,
            stamps: list[float] | None = None) -> Ledger:
    led = Ledger(url)
    job = led.job("notes")

    @job.decompose
    def _split(payload: dict[str, Any]) -> Any:
        for i in range(int(payload["n"])):
            yield Item(key=f"k{i}", data={"hold": payload.get("hold", 0)})

    @job.stage("note", idempotent=True)
    def _note(item: Any, ctx: Any) -> None:
        if item.data["hold"]:
            time.sleep(item.data["hold"])
        if seen is not None:
            seen.append(ctx.run_id)
        if stamps is not None:
            stamps.append(time.monotonic())

    return led


@pytest.mark.integration
@pytest.mark.parametrize("bad", ["", "a b", "tab\there", "x" * 201, "other", 7, "nul\x00",
                                 "\u200b"])
def test_a_bad_tenant_writes_nothing(db_url: str, bad: Any) -> None:
    led = _ledger(db_url)
    try:
        with pytest.raises(BadInput, match="tenant"):
            led.submit("notes", {"n": 1}, tenant=bad)
        with pytest.raises(BadInput, match="tenant"):
            led.job("notes").submit_many([({"n": 1}, "a")], tenant=bad)
        assert led.runs() == []
    finally:
        led.close()


@pytest.mark.integration
@pytest.mark.parametrize("bad", [0, 1001, -1, 1.5, True, "3", None])
def test_a_bad_weight_changes_nothing(db_url: str, bad: Any) -> None:
    led = _ledger(db_url)
    try:
        with pytest.raises(BadInput, match="weight"):
            led.set_tenant_weight("acme", bad)
        assert led.tenants() == []
    finally:
        led.close()


@pytest.mark.integration
def test_status_shows_the_tenant_and_a_repeat_returns_the_run_as_it_is(db_url: str) -> None:
    led = _ledger(db_url)
    try:
        sub = led.job("notes").submit({"n": 2}, key="a", tenant="acme")
        assert sub.status.tenant == "acme" and sub.status.to_dict()["tenant"] == "acme"
        again = led.job("notes").submit({"n": 2}, key="a", tenant="globex")
        assert again.created is False and again.status.tenant == "acme"
        plain = led.job("notes").submit({"n": 2}, key="b", tenant="default")
        assert plain.status.tenant is None  # "default" is the tenant of runs without one
        many = led.job("notes").submit_many([({"n": 1}, "c"), ({"n": 1}, "d")],
                                            tenant="globex")
        assert [s.status.tenant for s in many] == ["globex", "globex"]
        assert [s.run_id for s in led.runs(tenant="globex")] == [many[1].run_id,
                                                                  many[0].run_id]
        assert [s.run_id for s in led.runs(tenant="default")] == [plain.run_id]
        assert led.count_runs(tenant="acme") == 1
        assert led.set_tenant_weight("acme", 4, note="bigger plan") is True
        assert led.set_tenant_weight("acme", 4) is False
        assert [(t.name, t.weight, t.note) for t in led.tenants()] == [
            ("acme", 4, "bigger plan")]
    finally:
        led.close()


def _shares(seen: list[int], owner: dict[int, str], first: int) -> Counter[str]:
    return Counter(owner[run] for run in seen[:first])


@pytest.mark.integration
def test_a_tenant_with_one_run_gets_as_many_claims_as_one_with_forty(db_url: str) -> None:
    seen: list[int] = []
    led = _ledger(db_url, seen)
    try:
        job = led.job("notes")
        owner = {job.submit({"n": 20}, key=f"big-{i}", tenant="big").run_id: "big"
                 for i in range(40)}
        owner[job.submit({"n": 400}, key="small", tenant="small").run_id] = "small"
        led.work(chunk=10, concurrency=1, until_idle=True)
        assert len(seen) == 1200
        got = _shares(seen, owner, 400)  # while both have claimable work: half each
        assert abs(got["small"] - 200) <= 10, got
    finally:
        led.close()


@pytest.mark.integration
def test_shares_follow_the_weights_and_runs_without_a_tenant_share_one(db_url: str) -> None:
    seen: list[int] = []
    led = _ledger(db_url, seen)
    try:
        job = led.job("notes")
        owner = {job.submit({"n": 300}, key="heavy", tenant="heavy").run_id: "heavy"}
        owner |= {job.submit({"n": 30}, key=f"plain-{i}").run_id: "default" for i in range(10)}
        owner[job.submit({"n": 300}, key="light", tenant="light").run_id] = "light"
        assert led.set_tenant_weight("heavy", 3) is True
        led.work(chunk=5, concurrency=1, until_idle=True)
        assert len(seen) == 900
        got = _shares(seen, owner, 500)  # 3 : 1 : 1 while all three have work
        assert abs(got["heavy"] - 300) <= 15 and abs(got["light"] - 100) <= 15, got
        assert abs(got["default"] - 100) <= 15, got
    finally:
        led.close()


@pytest.mark.integration
def test_a_higher_priority_comes_before_every_tenant(db_url: str) -> None:
    seen: list[int] = []
    led = _ledger(db_url, seen)
    try:
        job = led.job("notes")
        job.submit({"n": 50}, key="a", tenant="a")
        job.submit({"n": 50}, key="b", tenant="b")
        urgent = job.submit({"n": 30}, key="urgent", tenant="b", priority=5).run_id
        led.work(chunk=5, concurrency=1, until_idle=True)
        assert seen[:30] == [urgent] * 30
    finally:
        led.close()


@pytest.mark.integration
def test_a_weight_set_by_another_process_reaches_a_busy_worker(db_url: str) -> None:
    seen: list[int] = []
    stamps: list[float] = []
    led = _ledger(db_url, seen, stamps)
    other = _ledger(db_url)
    try:
        job = led.job("notes")
        owner = {job.submit({"n": 1000, "hold": 0.002}, key=k, tenant=k).run_id: k
                 for k in ("a", "b")}
        worker = threading.Thread(target=led.work,
                                  kwargs={"chunk": 5, "concurrency": 1, "until_idle": True})
        worker.start()
        poll(lambda: len(seen) >= 50, timeout=30, what="both runs under way")
        assert other.set_tenant_weight("b", 4) is True
        changed = time.monotonic()
        worker.join(timeout=120)
        assert not worker.is_alive()
        # within a second the worker reads the weights again; from then on 4 : 1 while both
        # have work (until b's last item)
        b_done = max(t for t, r in zip(stamps, seen, strict=True) if owner[r] == "b")
        after = Counter(owner[r] for t, r in zip(stamps, seen, strict=True)
                        if changed + 1.2 <= t <= b_done)
        assert sum(after.values()) >= 200, after
        assert abs(after["b"] / sum(after.values()) - 0.8) <= 0.05, after
    finally:
        other.close()
        led.close()


# -- the CLI and HTTP --------------------------------------------------------------------------


def _cli(db_url: str, cwd: Path, *args: str, columns: int = 80
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_cmd("--db", db_url, "--app", "claims_app:ledger", *args),
                          cwd=cwd, env=cli_env() | {"COLUMNS": str(columns)},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_the_cli_submits_for_a_tenant_lists_its_runs_and_sets_its_weight(
        db_url: str, tmp_path: Path) -> None:
    sink = str(tmp_path / "calls.log")
    got = _cli(db_url, tmp_path, "submit", "notes", "--payload",
               json.dumps({"n": 2, "sink": sink}), "--tenant", "acme", "--json")
    assert got.returncode == 0, got.stderr
    body = json.loads(got.stdout)
    assert body["tenant"] == "acme"
    other = _cli(db_url, tmp_path, "submit", "notes", "--payload",
                 json.dumps({"n": 1, "sink": sink}), "--key", "plain")
    assert other.returncode == 0, other.stderr
    for bad in ("a b", "other", "x" * 300, ""):
        refused = _cli(db_url, tmp_path, "submit", "notes", "--payload",
                       json.dumps({"n": 1, "sink": sink}), "--key", "bad", "--tenant", bad)
        assert refused.returncode == 2, refused
        assert len(refused.stderr.strip().splitlines()) == 1 and "tenant" in refused.stderr
    listed = _cli(db_url, tmp_path, "runs", "--tenant", "acme", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["run_id"] for r in json.loads(listed.stdout)] == [body["run_id"]]
    table = _cli(db_url, tmp_path, "runs", columns=200)
    assert "acme" in table.stdout and "tenant" in table.stdout
    weighed = _cli(db_url, tmp_path, "tenant", "acme", "--weight", "3", "--note", "plan")
    assert weighed.returncode == 0, weighed.stderr
    assert "acme: weight 3" in weighed.stdout
    again = _cli(db_url, tmp_path, "tenant", "acme", "--weight", "3")
    assert "already" in again.stdout
    shown = _cli(db_url, tmp_path, "tenant", "acme")
    assert "weight 3" in shown.stdout and "1 open run" in shown.stdout, shown.stdout
    for bad in ("0", "1001", "x", "2.5"):
        refused = _cli(db_url, tmp_path, "tenant", "acme", "--weight", bad)
        assert refused.returncode == 2 and "weight" in refused.stderr, refused
    status = _cli(db_url, tmp_path, "status", str(body["run_id"]), "--json")
    assert json.loads(status.stdout)["tenant"] == "acme"


@pytest.mark.integration
def test_http_submits_for_a_tenant_and_lists_by_it(db_url: str) -> None:
    from web_support import client_for

    with client_for(db_url) as (client, ledger):
        got = client.post("/api/jobs/numbers/runs?tenant=acme", json={"n": 1})
        assert got.status_code == 201, got.text
        assert got.json()["tenant"] == "acme"
        run_id = got.json()["run_id"]
        assert "tenant acme" in client.get(f"/runs/{run_id}").text  # the dashboard shows it
        assert "tenant acme" in client.get("/").text
        bad = client.post("/api/jobs/numbers/runs?tenant=a%20b", json={"n": 2})
        assert bad.status_code == 400 and "tenant" in bad.json()["error"]
        assert len(ledger.runs()) == 1


# -- real worker processes ---------------------------------------------------------------------


@pytest.mark.concurrency
def test_two_worker_processes_share_claims_between_tenants(db_url: str,
                                                           tmp_path: Path) -> None:
    sink = tmp_path / "calls.log"
    owner: dict[int, str] = {}
    for tenant, runs, n in (("many", 30, 20), ("one", 1, 600)):
        for i in range(runs):
            got = _cli(db_url, tmp_path, "submit", "notes", "--key", f"{tenant}-{i}",
                       "--tenant", tenant, "--json", "--payload",
                       json.dumps({"n": n, "sink": str(sink), "hold": 0.001}))
            assert got.returncode == 0, got.stderr
            owner[json.loads(got.stdout)["run_id"]] = tenant
    workers = [subprocess.Popen(cli_cmd("--db", db_url, "--app", "claims_app:ledger", "worker",
                                        "--until-idle", "--chunk", "10", "--concurrency", "1"),
                                cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for p in workers:
            _, err = p.communicate(timeout=240)
            assert p.returncode == 0, err
    finally:
        for p in workers:
            p.kill()
    calls = sorted((float(c[3]), int(c[0])) for c in
                   (line.split() for line in sink.read_text().splitlines()))
    assert len(calls) == 1200
    first = Counter(owner[run] for _, run in calls[:600])
    assert abs(first["one"] - 300) <= 40, first
