pub mod clock;
pub mod log;
pub mod storage;
pub mod sync;
