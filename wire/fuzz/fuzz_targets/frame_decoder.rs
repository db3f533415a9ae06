//! Arbitrary bytes, as a peer could send them, through the whole read path: the frame
//! splitter (fed in two chunks, cut where the first byte says), then in-place validated access
//! to every frame body as each of the request types, then semantic validation of publishes and
//! updates.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ringpost_wire::messages::{
    AcknowledgeRequest, PublishRequest, PullRequest, Subscription, UpdateSubscriptionRequest,
    UpdateTopicRequest,
};
use ringpost_wire::validate::{validate_publish, validate_subscription_update, validate_topic_update};
use ringpost_wire::{access_body, FrameBuffer, FrameSplitter};

fuzz_target!(|data: &[u8]| {
    let cut = data.first().map_or(0, |first| (*first as usize).min(data.len()));
    let mut splitter = FrameSplitter::new();
    let mut frames = Vec::new();
    for chunk in [&data[..cut], &data[cut..]] {
        match splitter.push(chunk) {
            Ok(more) => frames.extend(more),
            Err(_) => break,
        }
    }
    for frame in frames {
        let mut body = FrameBuffer::with_capacity(frame.body.len().max(1));
        body.extend_from_slice(&frame.body);
        assert_eq!(frame.header.body_length as usize, body.len());

        if let Ok(request) = access_body::<PublishRequest>(&body) {
            let _ = validate_publish(request);
        }
        let _ = access_body::<PullRequest>(&body);
        if let Ok(request) = access_body::<AcknowledgeRequest>(&body) {
            for ack_id in request.ack_ids.iter() {
                let _ = ack_id.as_str().len();
            }
        }
        if let Ok(subscription) = access_body::<Subscription>(&body) {
            let _ = (subscription.name.as_str(), subscription.filter.as_str());
        }
        if let Ok(request) = access_body::<UpdateSubscriptionRequest>(&body) {
            let _ = validate_subscription_update(request);
        }
        if let Ok(request) = access_body::<UpdateTopicRequest>(&body) {
            let _ = validate_topic_update(request);
        }
    }
});
