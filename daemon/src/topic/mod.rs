//! Topics: the publish side, with the entries of each topic's subscription journal.

pub mod journal_entry;
