"""Between processes: agent discovery, frames, events on the wire, the client, injection."""
