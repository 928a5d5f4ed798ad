#!/usr/bin/env python3
"""A replica group that heartbeats to TorchFT's lighthouse and never asks for a quorum, with TorchFT's own client:
the straggler a lighthouse waits --join_timeout_ms for before it decides a quorum without it. Runs until killed.
  torchft_straggler.py http://host:port REPLICA_ID
"""
import sys
import time
from datetime import timedelta

from torchft._torchft import LighthouseClient

client = LighthouseClient(sys.argv[1], timedelta(seconds=10))
client.heartbeat(sys.argv[2])
print("heartbeating", flush=True)
while True:
    client.heartbeat(sys.argv[2])
    time.sleep(0.1)
