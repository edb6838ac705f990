"""Presence and matching of ``DdsTransport`` (``real.transport``): who is on the domain, by name.

``Presence`` is a mixin: ``DdsTransport``'s set-up creates the hello topic's
writer and reader (and writes this node's ``Hello``) and the endpoints whose
matches it names (this module does not import ``real.transport``).

* Presence: topic ``ctl/hello`` (TRANSIENT_LOCAL) carries
  ``Hello(node, guid, pid, host, tag, stream)`` (keyed on the participant, tagged under a key);
  ``peers()`` lists the live ones,
  and ``matched_peers()`` maps matched endpoints (GUIDs) to node names.
* Barriers: ``wait_peers`` waits until named nodes are present, ``wait_matched``
  until their readers (or writers) matched ours; on an addressed topic
  (``real.transport``) it also creates the writers of the named nodes' own DDS
  topics and waits for those to match.
"""

from __future__ import annotations

import hmac
import time
from typing import Iterable, Mapping, Optional

from dtemu.core.wire import frame_auth
from dtemu.real.dds_support import _matched_handles
from dtemu.real.wire import Hello


class Presence:
    """``DdsTransport``'s view of the other nodes on the domain; see the module docstring."""

    def participants(self) -> dict[str, str]:
        """Other live participants on the domain: {participant GUID: node name}.

        Invalid presence samples (real.wire.INVALID_HELLO: undecodable, or no sensible
        name; in a sealed run also those without a valid tag) are skipped, and the count
        of those currently on the domain is kept (stats ``invalid_hello``)."""
        return {s.guid: s.node for s in self._valid_hellos() if s.guid != self.guid}

    def _valid_hellos(self) -> list[Hello]:
        """The live, valid presence samples (counting the others in stats ``invalid_hello``)."""
        with self._lock:
            if self._closing:
                return []
            samples = self._hello_reader.read(N=100000, condition=self._hello_alive)
        valid = [s for s in samples if s.node and self._authentic(s)]
        self.stats["invalid_hello"] = len(samples) - len(valid)
        return valid

    def _authentic(self, hello: Hello) -> bool:
        if self.frame_key is None:
            return True
        want = frame_auth.hello_tag(self.frame_key, hello.node, hello.guid, hello.stream)
        return hmac.compare_digest(bytes(hello.tag), want)

    def stream_endpoints(self) -> dict[str, str]:
        """Where the other live nodes' streams listen (real.stream): {node name: endpoint}, of
        authentic announcements only; read again at most every 0.2 s (a frame asks per node)."""
        now = time.monotonic()
        cached = getattr(self, "_endpoints", None)
        if cached is not None and now - cached[0] < 0.2:
            return cached[1]
        eps = {s.node: s.stream for s in sorted(self._valid_hellos(), key=lambda s: s.guid)
               if s.stream and s.guid != self.guid}
        self._endpoints = (now, eps)
        return eps

    def peers(self) -> dict[str, str]:
        """Other live nodes on the domain: {node name: participant GUID} (of two participants
        that claim one name, one; unsealed, anyone can claim any name)."""
        return {node: guid for guid, node in sorted(self.participants().items())}

    def wait_peers(self, names: Iterable[str], timeout_s: float = 10.0, poll_s: float = 0.02) -> list[str]:
        """Wait until every node in ``names`` is present; return the ones still missing
        (empty list = all there)."""
        want = sorted(set(names) - {self.node})
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            have = self.peers()
            missing = [n for n in want if n not in have]
            if not missing or time.monotonic() >= deadline:
                return missing
            time.sleep(poll_s)

    def matched_peers(self, topics: Optional[Iterable[str]] = None) -> dict[str, dict[str, list[str]]]:
        """Per topic, the remote nodes matched with us: ``readers`` = nodes whose reader
        matched our writer (they get what we send), ``writers`` = nodes whose writer
        matched our reader (only for subscribed topics).  Endpoints of participants
        that have not said hello yet appear as "?<guid>"."""
        if isinstance(topics, str):
            topics = [topics]
        names = self.participants()
        out: dict[str, dict[str, list[str]]] = {}
        with self._lock:
            if self._closing:
                return {}
            for t in (list(topics) if topics is not None
                      else sorted((set(self._writers) | set(self._readers)) - set(self._logical))):
                rd, wr = set(), set()
                w = self._writers.get(t)
                if w is not None:
                    rd = self._endpoint_names(_matched_handles(w), w.get_matched_subscription_data, names)
                r = self._readers.get(t)
                if r is not None:
                    wr = self._endpoint_names(_matched_handles(r), r.get_matched_publication_data, names)
                out[t] = {"readers": sorted(rd), "writers": sorted(wr)}
        return out

    def _endpoint_names(self, handles, describe, names) -> set[str]:
        found = set()
        for h in handles:
            try:
                d = describe(h)
            except Exception:  # unmatched meanwhile
                continue
            if d is None:
                continue
            pk = str(d.participant_key)
            if pk == self.guid:
                continue
            found.add(names.get(pk, "?" + pk))
        return found

    def wait_matched(self, expected, timeout_s: float = 10.0, *, topics: Optional[Iterable[str]] = None,
                     role: str = "readers", poll_s: float = 0.02) -> dict:
        """The subscribe/publish barrier.  ``expected`` is one of

        * ``{topic: count}``  - at least ``count`` distinct remote nodes matched,
        * ``{topic: [names]}`` - these nodes matched,
        * ``[names]`` or ``count`` together with ``topics=[...]``.

        ``role="readers"`` (default) counts remote readers of our writers (who will
        receive what we send); ``role="writers"`` remote writers matched with our readers.
        Returns what is still missing when it gives up: ``{topic: missing names or
        missing count}``; an empty dict means everything matched."""
        if role not in ("readers", "writers"):
            raise ValueError("role must be 'readers' or 'writers'")
        if isinstance(expected, Mapping):
            want = dict(expected)
        else:
            if topics is None:
                raise ValueError("give topics=[...] with a list of names or a count")
            if isinstance(topics, str):
                topics = [topics]
            if not isinstance(expected, int):
                expected = sorted(set(expected))
            want = {t: expected for t in topics}
        # Addressed topics: each named reader must also match the writer of its own DDS topic.
        per_node: dict[str, tuple[str, str]] = {}  # per-node DDS topic -> (topic, node)
        if role == "readers":
            for t, exp in want.items():
                if t in self._addressed and not isinstance(exp, int):
                    for n in set(exp) - {self.node}:
                        self._addressed_writer(t, n)
                        per_node[self.addressed_topic(t, n)] = (t, n)
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            got = self.matched_peers(list(want) + list(per_node))
            missing = {}
            for t, exp in want.items():
                have = [n for n in got.get(t, {}).get(role, [])]
                if isinstance(exp, int):
                    if len(have) < exp:
                        missing[t] = exp - len(have)
                else:
                    lack = set(exp) - set(have) - {self.node}
                    lack |= {n for phys, (pt, n) in per_node.items()
                             if pt == t and n not in got.get(phys, {}).get("readers", [])}
                    if lack:
                        missing[t] = sorted(lack)
            if not missing or time.monotonic() >= deadline:
                return missing
            time.sleep(poll_s)
