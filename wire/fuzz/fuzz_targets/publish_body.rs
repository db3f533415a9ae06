//! Arbitrary bytes as a publish body: aligned as the daemon reads it, validated in place by
//! rkyv, then checked against every publish limit. Neither step may panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ringpost_wire::messages::PublishRequest;
use ringpost_wire::validate::validate_publish;
use ringpost_wire::{access_body, FrameBuffer};

fuzz_target!(|data: &[u8]| {
    let mut body = FrameBuffer::with_capacity(data.len().max(1));
    body.extend_from_slice(data);
    if let Ok(request) = access_body::<PublishRequest>(&body) {
        if validate_publish(request).is_ok() {
            // A request that validates must also deserialize.
            rkyv::deserialize::<PublishRequest, rkyv::rancor::Error>(request)
                .expect("a validated archive deserializes");
        }
    }
});
