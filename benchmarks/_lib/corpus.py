"""The benchmarks' corpus, which lives in ``sidecar.bench.workload`` beside the synthetic agent
turns of ``context-sidecar bench``: one place makes the project's synthetic transcripts.

Deterministic transcript events of about 200 o200k tokens each: prose, JSON and code. A turn is
four events (workload.TURN_SHAPE): the user's prose, the assistant's tool call (JSON), the
tool's result (JSON or code, tied to the call by call_id) and the assistant's answer (prose or
code). The same seed always gives the same events, byte for byte the texts the published figures
in docs/speed.md were measured on (tests/bench/test_workload.py pins them).
"""

from sidecar.bench import workload

EVENTS_PER_TURN = workload.EVENTS_PER_TURN
CorpusEvent = workload.CorpusEvent
_WORDS, _NAMES = workload.CORPUS_WORDS, workload.CORPUS_NAMES
prose, json_document, code = workload.corpus_prose, workload.corpus_json, workload.corpus_code
events, contents = workload.corpus_events, workload.corpus_contents
