//! Turning leased offsets into a delivery: reads them (every byte checksummed), acknowledges
//! those the filter rejects, holds back those whose ordering key is busy, and stops at the
//! response size limit or the stream's byte budget, giving back what does not fit. The
//! messages stay in the batches they were read into, which the delivery holds: a protocol can
//! send their data from there, copied only by the kernel; no allocation per message.

use super::budget::{StreamReservation, PULL_RESPONSE_BYTES_MAX};
use super::journal_entry::{runs_of, JournalEntry};
use super::source::{AckJournal, MessageSource, SourceBatch};
use super::state::{AckId, Delivery as Lease};
use super::SubscriptionEntry;
use super::SubscriptionError;
use crate::api::data::{DeliveredMessage, Delivery};
use crate::ids::{MessageId, Offset};
use crate::log::record::RecordView;
use crate::log::LogError;

/// Reads `leases` into a delivery of at most `bytes_budget` bytes of messages (and at most
/// `PULL_RESPONSE_BYTES_MAX`); `None` when no message is left to send, the reservation then
/// given back.
pub async fn read<T: MessageSource + AckJournal>(
    subscription: &SubscriptionEntry,
    topic: &T,
    mut leases: Vec<Lease>,
    bytes_budget: Option<u64>,
    reservation: StreamReservation,
) -> Result<Option<Delivery<T::Batch>>, SubscriptionError> {
    leases.sort_by_key(|lease| lease.offset);
    let byte_limit = bytes_budget.unwrap_or(u64::MAX).min(PULL_RESPONSE_BYTES_MAX as u64) as usize;
    let offsets: Vec<Offset> = leases.iter().map(|lease| lease.offset).collect();
    let give_back = |leases: Vec<Lease>, error: LogError| {
        let mut state = subscription.state.borrow_mut();
        for lease in leases {
            state.release(lease);
        }
        SubscriptionError::from(error)
    };
    // Only as many batches as the response can carry are read: a thousand leased messages
    // of 1 MB each were all read, and held, for a response of twelve.
    let (batches, covered) = match topic.hold_offsets(&offsets, byte_limit).await {
        Ok(held) => held,
        Err(error) => return Err(give_back(leases, error)),
    };
    let unread = leases.split_off(covered);
    if !unread.is_empty() {
        let mut state = subscription.state.borrow_mut();
        for lease in unread {
            state.release(lease);
        }
    }
    let offsets = &offsets[..covered];
    // Only the span the leases cover is parsed; the walk in `choose` skips the records inside
    // it that are not delivered (acknowledged already, or leased elsewhere).
    let wanted = crate::log::span(offsets);
    let mut records = Vec::with_capacity(offsets.len());
    for (index, batch) in batches.iter().enumerate() {
        match batch.records_in(wanted.clone()) {
            Ok(views) => records.extend(views.into_iter().map(|view| (index, view))),
            Err(error) => return Err(give_back(leases, error)),
        }
    }
    let chosen = choose(subscription, &batches, records, leases, byte_limit);
    if !chosen.filtered_out.is_empty() {
        acknowledge_filtered_out(subscription, topic, chosen.filtered_out).await;
    }
    if chosen.messages.is_empty() {
        return Ok(None);
    }
    let now_ms = crate::runtime::wall_ms();
    for message in chosen.messages.iter().filter(|message| message.delivery_attempt == 1) {
        crate::metrics::shard::record_delivery(now_ms.saturating_sub(message.publish_time_ms));
    }
    Ok(Some(Delivery {
        batches: holding(batches, &chosen.messages),
        messages: renumbered(chosen.messages),
        ack_ids: chosen.ack_ids,
        reservation,
    }))
}

/// What `choose` picked out of the records read.
struct Chosen {
    messages: Vec<DeliveredMessage>,
    ack_ids: String,
    filtered_out: Vec<Offset>,
}

/// Walks the leases and the records read together (both in offset order) and picks those to
/// deliver.
fn choose<B: SourceBatch>(
    subscription: &SubscriptionEntry,
    batches: &[B],
    records: Vec<(usize, RecordView<'_>)>,
    leases: Vec<Lease>,
    byte_limit: usize,
) -> Chosen {
    let mut records = records.into_iter().peekable();
    let mut chosen = Chosen {
        messages: Vec::with_capacity(leases.len()),
        ack_ids: String::with_capacity(leases.len() * 24),
        filtered_out: Vec::new(),
    };
    let mut bytes = 0usize;
    let mut state = subscription.state.borrow_mut();
    for lease in leases {
        while records.next_if(|(_, record)| record.offset < lease.offset).is_some() {}
        let Some((batch, record)) = records.next_if(|(_, record)| record.offset == lease.offset) else {
            // Below the log's start: removed by retention. Nothing to deliver.
            state.apply_ack(lease.offset);
            continue;
        };
        // A replicated topic's new leader writes one record of its own, with no data and no
        // attributes (no publish can be: Pub/Sub refuses such a message): nobody's message,
        // acknowledged like one a filter rejects.
        let marker = record.data.is_empty() && record.attribute_count() == 0;
        if marker || subscription.filter.as_ref().is_some_and(|filter| !filter.matches(record.attributes())) {
            chosen.filtered_out.push(lease.offset);
            continue;
        }
        let size = record.data.len()
            + record.ordering_key.len()
            + record.attributes().map(|(k, v)| k.len() + v.len() + 16).sum::<usize>();
        if !chosen.messages.is_empty() && bytes + size > byte_limit {
            state.release(lease);
            continue;
        }
        if !state.admit(lease, record.ordering_key) {
            continue;
        }
        bytes += size;
        state.account(lease.offset, size as u64);
        let ack_id = AckId {
            subscription_id: subscription.id,
            source: state.source,
            offset: lease.offset,
            generation: lease.generation,
        };
        let start = chosen.ack_ids.len();
        ack_id.encode_into(&mut chosen.ack_ids);
        let ack_id = start..chosen.ack_ids.len();
        let message_id = MessageId::new(state.source, record.offset).get();
        chosen.messages.push(located(
            batches[batch].as_ref(),
            batch,
            &record,
            message_id,
            ack_id,
            lease.attempt,
        ));
    }
    chosen
}

/// Where `record`'s parts lie in `bytes`, its batch's. A record is laid out as its header,
/// ordering key, attributes and data, in that order.
fn located(
    bytes: &[u8],
    batch: usize,
    record: &RecordView<'_>,
    message_id: u64,
    ack_id: std::ops::Range<usize>,
    delivery_attempt: u32,
) -> DeliveredMessage {
    let at = |part: &[u8]| part.as_ptr() as usize - bytes.as_ptr() as usize;
    let ordering_key =
        at(record.ordering_key.as_bytes())..at(record.ordering_key.as_bytes()) + record.ordering_key.len();
    let data = at(record.data)..at(record.data) + record.data.len();
    debug_assert!(ordering_key.end <= data.start && data.end <= bytes.len());
    DeliveredMessage {
        batch,
        message_id,
        publish_time_ms: record.publish_time_ms,
        attributes: ordering_key.end..data.start,
        attribute_count: record.attribute_count() as u16,
        ordering_key,
        data,
        ack_id,
        delivery_attempt,
    }
}

/// The batches the delivery sends from, each with the bytes it counts against the shard's
/// budget for held buffers; the others (their messages did not fit, were filtered out or wait
/// behind their ordering key) go now. Batches read in one extent share its buffer, and their
/// slices end where it ends: each buffer counts once, by its first (longest) slice.
fn holding<B: SourceBatch>(batches: Vec<B>, messages: &[DeliveredMessage]) -> Vec<(B, usize)> {
    let mut sends_from = vec![false; batches.len()];
    for message in messages {
        sends_from[message.batch] = true;
    }
    let mut buffer_ends = Vec::with_capacity(batches.len());
    batches
        .into_iter()
        .zip(sends_from)
        .filter_map(|(batch, sends)| sends.then_some(batch))
        .map(|batch| {
            let bytes = batch.as_ref();
            let end = bytes.as_ptr() as usize + bytes.len();
            let charge = if buffer_ends.contains(&end) { 0 } else { bytes.len() };
            buffer_ends.push(end);
            (batch, charge)
        })
        .collect()
}

/// The messages with their batch numbers among the batches kept by `holding`: both are in
/// offset order, so a message's new number counts the distinct batches before it.
fn renumbered(mut messages: Vec<DeliveredMessage>) -> Vec<DeliveredMessage> {
    let (mut previous, mut number) = (None, 0);
    for message in &mut messages {
        if previous.is_some_and(|previous| previous != message.batch) {
            number += 1;
        }
        previous = Some(message.batch);
        message.batch = number;
    }
    messages
}

/// Messages the filter rejects are acknowledged, durably, as Pub/Sub does.
async fn acknowledge_filtered_out<T: AckJournal>(
    subscription: &SubscriptionEntry,
    topic: &T,
    offsets: Vec<Offset>,
) {
    let entry = JournalEntry::Acked { subscription_id: subscription.id, runs: runs_of(&offsets) };
    match topic.record(&entry).await {
        Ok(()) => {
            let mut state = subscription.state.borrow_mut();
            for offset in offsets {
                state.apply_ack(offset);
            }
        }
        Err(error) => crate::log_warn!("ringpostd: acknowledging filtered-out messages: {error}"),
    }
    subscription.changed.notify_all();
}
