//! What the daemon writes is its owner's alone: data files 0600, folders 0700.

use ringpost_client::{block_on, Message};
use ringpost_tests::{create_topic_and_subscription, drain, Daemon};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn modes_under(path: &Path, found: &mut Vec<(String, u32, bool)>) {
    for entry in std::fs::read_dir(path).unwrap() {
        let entry = entry.unwrap();
        let metadata = entry.metadata().unwrap();
        found.push((
            entry.path().display().to_string(),
            metadata.permissions().mode() & 0o777,
            metadata.is_dir(),
        ));
        if metadata.is_dir() {
            modes_under(&entry.path(), found);
        }
    }
}

#[test]
fn data_files_are_0600_and_folders_0700() {
    let daemon = Daemon::start("permissions");
    let client = daemon.client();
    create_topic_and_subscription(&client, "private", "private-sub", 10);
    block_on(client.publish("private", vec![Message::new("secret")])).unwrap();
    assert_eq!(drain(&client, "private-sub", true).len(), 1);
    let data = &daemon.data_dirs[0];
    assert_eq!(std::fs::metadata(data).unwrap().permissions().mode() & 0o777, 0o700);
    let mut found = Vec::new();
    modes_under(data, &mut found);
    assert!(found.iter().any(|(_, _, is_dir)| !is_dir), "the daemon wrote files: {found:?}");
    let open: Vec<_> =
        found.iter().filter(|(_, mode, is_dir)| *mode != if *is_dir { 0o700 } else { 0o600 }).collect();
    assert!(open.is_empty(), "readable by others: {open:?}");
}
