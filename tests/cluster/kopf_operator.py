"""A minimal kopf operator for the emulator tests: create, update, status, delete (finalizer), resume.

Every handler appends a line to $EVENTS_FILE so the test can see what ran.
"""
import os

import kopf

GROUP, VERSION, PLURAL = "example.specfleet.io", "v1", "widgets"


def note(text: str) -> None:
    with open(os.environ["EVENTS_FILE"], "a") as f:
        f.write(text + "\n")


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    settings.watching.server_timeout = 30
    settings.watching.client_timeout = 40
    settings.watching.reconnect_backoff = 0.2
    settings.batching.idle_timeout = 0.2
    settings.batching.batch_window = 0.05
    settings.persistence.finalizer = "example.specfleet.io/finalizer"


@kopf.on.create(GROUP, VERSION, PLURAL)
def created(name, spec, patch, body, **_):
    note(f"create {name} {spec['size']}")
    kopf.info(body, reason="Created", message=f"widget {name} is {spec['size']}")
    patch.status["phase"] = "Created"
    return {"size": spec["size"]}


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec.size")
def updated(name, old, new, patch, **_):
    note(f"update {name} {old}->{new}")
    patch.status["phase"] = f"Resized-{new}"


@kopf.on.resume(GROUP, VERSION, PLURAL)
def resumed(name, **_):
    note(f"resume {name}")


@kopf.on.delete(GROUP, VERSION, PLURAL)
def deleted(name, **_):
    note(f"delete {name}")
