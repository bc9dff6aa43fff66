"""Carries out the ops' instructions over the transport, on the client's background event loop.

The ops (connector/client/ops) decide; the modules here send what they ask for, feed them the answers and
wait for their outcome, one module per op family: add.py (the add pipeline and its ensemble changes),
recovery.py (fence, read past the LAC, write back, close), read.py (range reads, chunk reads, LAC reads).
context.py holds what they share: the network, the metadata store and the clock.
"""
from connector.client.runner.add import AddPipeline
from connector.client.runner.context import Context, schedule_of
from connector.client.runner.read import read_chunk, read_last_add_confirmed, read_range, wait_last_add_confirmed
from connector.client.runner.recovery import recover
from connector.client.runner.runtime import Runtime

__all__ = ["AddPipeline", "Context", "Runtime", "read_chunk", "read_last_add_confirmed", "read_range", "recover",
           "schedule_of", "wait_last_add_confirmed"]
