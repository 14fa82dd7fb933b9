"""Text services used by every area: token counting and its offline encodings, secret redaction,
and fencing of untrusted text."""
