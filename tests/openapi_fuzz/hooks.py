"""Hooks of schemathesis for tests/it/openapi_fuzz.rs.

- Half of the cases whose path parameters schemathesis made valid name a
  job, a task or a job type the server really holds (JOBCENTER_FUZZ_JOBS,
  JOBCENTER_FUZZ_TASKS and JOBCENTER_FUZZ_JOB_TYPES, comma-separated), so
  that reads reach real records and not only 404s. Not in the stateful
  phase: there a link fills them from an answer (the id of a job just
  submitted), and a known task of another job beside it would be a 404
  that schemathesis takes for a created resource gone missing.
- The check `refused_write_changes_nothing`: a write the server refuses
  (4xx) commits nothing to its store but its audit record, and leaves the
  scheduler's pause as it was. After each write's answer it reads the
  store's group commits (`jobcenter_commit_seconds_count` of /metrics) less
  the audit trail's records (/api/audit, each written in a commit of its
  own when it records a refusal) and the pause
  (/api/instances) with the token (JOBCENTER_FUZZ_ADDRESS,
  JOBCENTER_FUZZ_TOKEN); a refused write must find them as the write before
  it left them (the first write, as they were before it). This holds
  because the test keeps the server otherwise idle (no worker runs anything,
  no duty of its own is due, and the reads change nothing, which the test
  checks too) and schemathesis sends one request at a time.
- With JOBCENTER_FUZZ_REFUSED set, the check `write_refused`: every write
  must be refused (401 or 403).
"""

import json
import os
import threading
import urllib.request
import zlib

import schemathesis
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation.meta import TestPhase

WRITES = ("POST", "PUT", "DELETE", "PATCH")


def _known(name):
    return [value for value in os.environ.get(name, "").split(",") if value]


KNOWN = {
    "id": _known("JOBCENTER_FUZZ_JOBS"),
    "task": _known("JOBCENTER_FUZZ_TASKS"),
    "job_type": _known("JOBCENTER_FUZZ_JOB_TYPES"),
}


@schemathesis.hook
def map_case(context, case):
    meta = case.meta
    if not case.path_parameters or (
        meta is not None and (meta.is_negative_at(ParameterLocation.PATH) or meta.phase.name == TestPhase.STATEFUL)
    ):
        return case
    # Chosen from what was generated, so that the same draw maps the same way.
    draw = zlib.crc32(repr(sorted(case.path_parameters.items())).encode())
    if draw % 2:
        return case
    for name in list(case.path_parameters):
        known = KNOWN.get(name)
        if known:
            case.path_parameters[name] = known[(draw >> 1) % len(known)]
    return case


def _get(path):
    request = urllib.request.Request(
        f"http://{os.environ['JOBCENTER_FUZZ_ADDRESS']}{path}",
        headers={"Authorization": f"Bearer {os.environ['JOBCENTER_FUZZ_TOKEN']}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read().decode()


def _state():
    """What a refused write must leave as it was: (store commits other than
    the audit trail's, paused per instance). A refusal is recorded in the
    audit trail, one record in a commit of its own, so the commits less the
    records are what must not move."""
    commits = next(
        float(line.split()[-1])
        for line in _get("/metrics").splitlines()
        if line.startswith("jobcenter_commit_seconds_count")
    )
    records = len(json.loads(_get("/api/audit?limit=0"))["records"])
    paused = [instance["paused"] for instance in json.loads(_get("/api/instances"))["instances"]]
    return int(commits) - records, paused


def _is_declared_write(method, case):
    # A method the operation does not serve is the check `unsupported_method`'s (405).
    return method in WRITES and method == case.operation.method.upper()


# The state after the last write's answer: the server being otherwise idle,
# the state before the next write.
_last = {}
_lock = threading.Lock()


@schemathesis.hook
def before_call(context, case, kwargs):
    if _is_declared_write(case.method.upper(), case):
        with _lock:
            if "state" not in _last:
                _last["state"] = _state()


@schemathesis.check
def refused_write_changes_nothing(ctx, response, case):
    """A write answered 4xx commits nothing and pauses or resumes nothing."""
    method = response.request.method.upper()
    if not _is_declared_write(method, case):
        return None
    with _lock:
        before = _last.get("state")
        after = _last["state"] = _state()
    if before is not None and 400 <= response.status_code < 500 and after != before:
        raise AssertionError(
            f"{method} {case.path} was refused ({response.status_code}) and yet changed the server: "
            f"store commits {before[0]} -> {after[0]}, scheduler paused {before[1]} -> {after[1]}"
        )
    return None


if os.environ.get("JOBCENTER_FUZZ_REFUSED"):

    @schemathesis.check
    def write_refused(ctx, response, case):
        """Every write in this phase lacks what it needs (the session's anti-forgery token, or its own site)."""
        method = response.request.method.upper()
        if not _is_declared_write(method, case):
            return None
        if response.status_code not in (401, 403):
            raise AssertionError(
                f"{method} {case.path} was not refused: {response.status_code} {response.text[:200]}"
            )
        return None
