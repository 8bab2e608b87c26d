"""AMQP 1.0 encoding without proton: the type codec and section scanner (`sections`) and
the frame header (`frames`).

Imported by every room that reads or writes AMQP bytes (protocol, store, management, the
event log); it imports only the standard library (STYLE.md section 2).
"""
