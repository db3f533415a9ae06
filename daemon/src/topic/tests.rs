//! A topic's logs on a simulated disk whose opens yield as the real ones do, so that tasks of
//! the shard interleave at them: what one task renames or removes while another opens it.

use super::open::TopicStore;
use super::{journal_folder, TopicState};
use crate::ids::TopicId;
use crate::log::{Directories, LogConfig, RESERVE_MAKING_NAME, RESERVE_NAME};
use crate::storage::sim::SimDisk;
use crate::storage::Storage;
use std::path::PathBuf;
use std::rc::Rc;

fn run<F: std::future::Future<Output = ()> + 'static>(future: F) {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).make().unwrap().run(future);
}

/// A topic whose journal is closed (nothing acknowledged yet), on a disk whose opens yield.
async fn topic(disk: &SimDisk) -> Rc<TopicState<SimDisk>> {
    disk.set_opens_yield(true);
    let store = TopicStore::new(disk.clone(), Directories::new(vec!["/d0".into()]), LogConfig::default());
    Rc::new(store.open(TopicId::new(7), "many".into(), 0, false, false).await.expect("the topic opens"))
}

fn journal_file(name: &str) -> PathBuf {
    PathBuf::from("/d0").join(journal_folder(TopicId::new(7))).join(name)
}

/// A topic's first publish has its journal's reserve made in the background, and segment
/// collection asks for it too while it is not made yet: at 10,000 topics the two met, two
/// `make_reserve` ran on one folder, one renamed the file the other was opening (glommio's
/// open then panicked on the vanished path, taking the shard down) and the other failed with
/// ENOENT. One of them must make it, and nothing may be opened while it goes.
#[test]
fn a_reserve_asked_for_twice_at_once_is_made_once() {
    run(async {
        let disk = SimDisk::new();
        let topic = topic(&disk).await;
        let (first, second) =
            futures_lite::future::zip(topic.reserve_journal_space(), topic.reserve_journal_space()).await;
        assert!(first.is_ok(), "{first:?}");
        assert!(second.is_ok(), "{second:?}");
        assert_eq!(disk.opens_raced(), 0, "a file was renamed or removed while it was being opened");
        assert!(disk.exists(&journal_file(RESERVE_NAME)), "no reserve");
        assert!(!disk.exists(&journal_file(RESERVE_MAKING_NAME)), "a reserve half made was left");
    });
}

/// The journal opening (a first acknowledgement, or a replica's logs) while its reserve is
/// being made waits for it, and adopts it: its recovery would remove the file being made.
#[test]
fn the_journal_opens_after_its_reserve_is_made() {
    run(async {
        let disk = SimDisk::new();
        let topic = topic(&disk).await;
        let (made, journal) =
            futures_lite::future::zip(topic.reserve_journal_space(), topic.journal_log()).await;
        assert!(made.is_ok(), "{made:?}");
        let journal = journal.expect("the journal opens");
        assert_eq!(disk.opens_raced(), 0, "a file was renamed or removed while it was being opened");
        assert!(journal.has_reserve(), "the journal did not adopt the reserve made beside it");
    });
}
