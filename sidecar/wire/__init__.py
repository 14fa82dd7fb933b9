"""The wire layer: the only code that imports grpc or the API stubs (``sidecar.pb``).

It turns requests into domain calls and domain answers and errors into messages and statuses;
it makes no decision of its own about windows, memory or runs.
"""
