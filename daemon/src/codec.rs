//! A small binary codec for the daemon's own durable entries (catalog and journal), and for the
//! control messages between nodes (`control::codec`). A durable entry is always inside a
//! checksummed log record, but a control message comes from the network, so decoding must hold
//! for any bytes: it never panics, and it checks each length against the input before taking
//! (or allocating) what it counts.

pub struct Encoder(pub Vec<u8>);

impl Encoder {
    pub fn new(kind: u8) -> Encoder {
        Encoder(vec![kind])
    }
    pub fn u8(&mut self, value: u8) -> &mut Self {
        self.0.push(value);
        self
    }
    pub fn u32(&mut self, value: u32) -> &mut Self {
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }
    pub fn u64(&mut self, value: u64) -> &mut Self {
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }
    pub fn bool(&mut self, value: bool) -> &mut Self {
        self.u8(value as u8)
    }
    pub fn str(&mut self, value: &str) -> &mut Self {
        self.u32(value.len() as u32);
        self.0.extend_from_slice(value.as_bytes());
        self
    }
}

pub struct Decoder<'a> {
    bytes: &'a [u8],
}

pub type DecodeResult<T> = Result<T, &'static str>;

impl<'a> Decoder<'a> {
    pub fn new(bytes: &'a [u8]) -> Decoder<'a> {
        Decoder { bytes }
    }
    fn take(&mut self, count: usize) -> DecodeResult<&'a [u8]> {
        if self.bytes.len() < count {
            return Err("entry is truncated");
        }
        let (head, tail) = self.bytes.split_at(count);
        self.bytes = tail;
        Ok(head)
    }
    pub fn u8(&mut self) -> DecodeResult<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> DecodeResult<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub fn u64(&mut self) -> DecodeResult<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub fn bool(&mut self) -> DecodeResult<bool> {
        Ok(self.u8()? != 0)
    }
    pub fn str(&mut self) -> DecodeResult<String> {
        let length = self.u32()? as usize;
        std::str::from_utf8(self.take(length)?).map(str::to_owned).map_err(|_| "string is not UTF-8")
    }
    /// The next `count` bytes as they are.
    pub fn bytes(&mut self, count: usize) -> DecodeResult<&'a [u8]> {
        self.take(count)
    }
    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}
