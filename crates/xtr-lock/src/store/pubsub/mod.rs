//! The Redis pub/sub liveness lock (portalocker 4.x's protocol; see docs/pubsub.md): a lock
//! is a live subscription, released the instant its holder's connection closes.
//!
//! Built in steps: the protocol's decisions (`decide`) first, the connections and the store on
//! top of them next.

mod decide;
