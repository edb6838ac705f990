"""Availability traces: the file ``fl.availability.trace`` names, read for the runtimes.

The format and its meaning are core's (``core.fl.population.parse_trace``); this
module reads the file (bounded in size, UTF-8) and hands its windows over, so a
trace that cannot be read is refused, with the key and the file, before a run starts.
"""

from __future__ import annotations

from pathlib import Path

from dtemu.core.errors import ScenarioError
from dtemu.core.fl.population import MAX_TRACE_BYTES, Population, parse_trace
from dtemu.core.scenario import Scenario


def load_population(scenario: Scenario) -> Population | None:
    """The leader's population (None where the mode asks every node: core.modes); reads the trace file
    if the scenario names one."""
    if not scenario.kind.chooses_clients:
        return None
    spec = scenario.fl.availability
    if spec.kind != "trace":
        return Population(scenario)
    path = Path(spec.trace)
    try:
        if path.stat().st_size > MAX_TRACE_BYTES:
            raise ScenarioError("fl.availability.trace", f"{path} is more than {MAX_TRACE_BYTES:,} bytes")
        text = path.read_bytes().decode("utf-8")
    except OSError as err:
        raise ScenarioError("fl.availability.trace", f"cannot read {path}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ScenarioError("fl.availability.trace", f"{path} is not UTF-8 ({err.reason} at byte {err.start})") from None
    return Population(scenario, parse_trace(text, scenario.client_names, str(path)))
