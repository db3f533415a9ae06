//! What a one-message publish costs the shard that owns its topic, measured without the network
//! and the disk: the shard's own work for each request, from its body to its response, on an
//! in-memory disk (`storage::sim`). Built with the `profiling` feature for the example
//! `one_message_publishes`, which counts allocations with its own allocator and runs under
//! `valgrind --tool=callgrind` for instructions (benches/README.md, 2026-12-07); the test below
//! runs it in a plain `cargo test`.
//!
//! Each request goes as the connection's reader sends it on (`net::server::connection`): its
//! body copied out of the read buffer into its own frame buffer, its own task, the forwarder's
//! handler, the request metrics. Commits are shared, as `in_flight` requests wait together.

use crate::clock::ManualClock;
use crate::control::ControlRequest;
use crate::ids::{SourceId, TopicId};
use crate::log::{Directories, LogConfig};
use crate::net::server::{Handler, Responder, Response};
use crate::shard::Forwarder;
use crate::storage::sim::SimDisk;
use ringpost_wire::frame::{FrameBuffer, FrameHeader};
use ringpost_wire::limits::FRAME_HEADER_BYTES;
use ringpost_wire::messages::{PublishRequest, PubsubMessage};
use ringpost_wire::Command;
use std::rc::Rc;

/// One measurement's shape.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Requests measured, after a warm-up of `in_flight` requests.
    pub requests: usize,
    /// Requests waiting for their commit together.
    pub in_flight: usize,
    /// The message's data, in bytes.
    pub data_bytes: usize,
}

/// The topic's log never rolls during a measurement: a roll's files would be counted against
/// the requests it fell among.
const SEGMENT_BYTES: u64 = 64 << 20;

/// Runs `shape.requests` one-message publishes through a forwarder's handler and returns what
/// `counter` (a count of allocations, say) grew by over them.
pub fn one_message_publishes(shape: Shape, counter: fn() -> u64) -> u64 {
    assert!(
        shape.requests as u64 * (shape.data_bytes as u64 + 256) < SEGMENT_BYTES,
        "{shape:?} would roll the topic's log"
    );
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("an executor for the measurement")
        .run(measure(shape, counter))
}

async fn measure(shape: Shape, counter: fn() -> u64) -> u64 {
    let config = LogConfig {
        segment_bytes_initial: SEGMENT_BYTES,
        segment_bytes_max: SEGMENT_BYTES,
        ..LogConfig::default()
    };
    let clock = Rc::new(ManualClock::default());
    let forwarder =
        Rc::new(Forwarder::new(0, SimDisk::new(), Directories::new(vec!["/d0".into()]), config, clock));
    forwarder
        .control(ControlRequest::AttachTopic {
            topic_id: TopicId::new(1),
            name: "measured".into(),
            retention_seconds: 24 * 3600,
            recovering: false,
            source: SourceId::FIRST,
            active: 1,
        })
        .await
        .expect("the measured topic attaches");
    let request = PublishRequest {
        topic: "measured".into(),
        messages: vec![PubsubMessage { data: vec![7u8; shape.data_bytes], ..Default::default() }],
    };
    let frame = Rc::new(ringpost_wire::encode_frame(Command::Publish.code(), 0, 1, &request));
    // The first commit reserves the journal's space and fills the caches: not a request's cost.
    // One responder for every request, as a connection's requests share its session.
    let responder = Rc::new(Responder::unconnected());
    round(&forwarder, &responder, &frame, shape.in_flight).await;
    let before = counter();
    let mut left = shape.requests;
    while left > 0 {
        let count = left.min(shape.in_flight);
        round(&forwarder, &responder, &frame, count).await;
        left -= count;
    }
    counter() - before
}

/// `count` requests at once, each in its own task, as the connection dispatches them.
async fn round(
    forwarder: &Rc<Forwarder<SimDisk>>,
    responder: &Rc<Responder>,
    frame: &Rc<FrameBuffer>,
    count: usize,
) {
    let tasks: Vec<_> = (0..count)
        .map(|_| {
            let (forwarder, responder, frame) = (forwarder.clone(), responder.clone(), frame.clone());
            crate::runtime::spawn(async move {
                let header = FrameHeader::decode(&frame).expect("the request's header");
                let mut body = FrameBuffer::with_capacity(frame.len() - FRAME_HEADER_BYTES);
                body.extend_from_slice(&frame[FRAME_HEADER_BYTES..]);
                let started = crate::runtime::now();
                let response = forwarder.handle(header, body, &responder).await;
                let Response::Frame(response) = response else { panic!("a publish answers with a frame") };
                let header = FrameHeader::decode(&response).expect("the response's header");
                assert!(!header.is_error(), "a measured publish failed");
                crate::metrics::requests::record(header.command, 0, Some(crate::runtime::now() - started));
            })
        })
        .collect();
    for task in tasks {
        task.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_measurement_publishes() {
        let shape = Shape { requests: 100, in_flight: 8, data_bytes: 1024 };
        assert_eq!(one_message_publishes(shape, || 0), 0);
    }
}
