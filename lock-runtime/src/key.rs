use std::cell::RefCell;
use std::fmt::{self, Display, Write};
use std::ops::Deref;
use std::sync::Arc;

use crate::LockError;

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 64 * 1024;

/// Builds a lock key from a prefix and the `Display` of each part.
///
/// This is the one way keys are built, by `#[distributed_lock]` and by hand. The
/// prefix is taken as written, so `LockKey::new("tenant:order").part(42)` and the
/// plain key `"tenant:order:42"` name the same lock. Parts are escaped so that for
/// one prefix distinct tuples never share a key: `("a:b", "c")` and `("a", "b:c")`
/// give `a\:b:c` and `a:b\:c`.
///
/// ```
/// use lock_runtime::LockKey;
///
/// let key = LockKey::new("transfer").part(42).part("eu:west");
/// assert_eq!(&*key, r"transfer:42:eu\:west");
/// assert_eq!(&*LockKey::new("tenant:order").part(42), "tenant:order:42");
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LockKey(String);

impl LockKey {
    /// Starts a key with `prefix`, as written.
    pub fn new(prefix: &str) -> Self {
        let mut key = String::with_capacity(prefix.len() + 24);
        key.push_str(prefix);
        LockKey(key)
    }

    /// Appends one part: a `:` and the part's `Display`, escaped as it is written.
    pub fn part(mut self, value: impl Display) -> Self {
        self.0.push(':');
        write!(Escaper(&mut self.0), "{value}").expect("formatting into a String cannot fail");
        self
    }

    /// The key as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as an owned `String`.
    pub fn into_string(self) -> String {
        self.0
    }
}

/// Writes through to a `String`, escaping the part separator and the escape itself.
struct Escaper<'a>(&'a mut String);

impl Write for Escaper<'_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        for c in text.chars() {
            if c == ':' || c == '\\' {
                self.0.push('\\');
            }
            self.0.push(c);
        }
        Ok(())
    }
}

impl Deref for LockKey {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for LockKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<LockKey> for String {
    fn from(key: LockKey) -> String {
        key.0
    }
}

impl Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// The Redis names of one lock. All of them carry the same `{...}` hash tag, so on a
/// Cluster they live in one slot. Braces in the key are percent-encoded so that no key
/// can move the tag. Cheap to clone: every part of the client that follows the lock
/// shares the one allocation an acquire makes for its name.
#[derive(Debug, Clone)]
pub(crate) struct LockName {
    /// The lock's own name, then the key as the caller gave it.
    names: Arc<str>,
    /// Where the lock's name ends in `names`.
    hash_end: usize,
}

impl LockName {
    pub(crate) fn new(key: &str) -> Result<Self, LockError> {
        let reason = if key.is_empty() {
            "a key must not be empty; give the lock a prefix or a key part"
        } else if key.len() > MAX_KEY_LEN {
            "a key must be at most 64 KiB; derive a shorter key (an id or a hash) from the data"
        } else {
            return Ok(NAMES.with_borrow_mut(|names| Self::build(key, names)));
        };
        Err(LockError::InvalidKey {
            key: key.to_owned(),
            reason,
        })
    }

    /// Writes the lock's name and the key into `names`, a buffer the thread keeps, and
    /// copies them into the one allocation they are shared from.
    fn build(key: &str, names: &mut String) -> Self {
        names.clear();
        names.push_str("lock:{");
        let mut rest = key;
        // Bytes, not chars: the three are ASCII, which no other character's UTF-8
        // contains.
        while let Some(at) = memchr::memchr3(b'%', b'{', b'}', rest.as_bytes()) {
            names.push_str(&rest[..at]);
            names.push_str(match rest.as_bytes()[at] {
                b'%' => "%25",
                b'{' => "%7B",
                _ => "%7D",
            });
            rest = &rest[at + 1..];
        }
        names.push_str(rest);
        names.push('}');
        let hash_end = names.len();
        names.push_str(key);
        let built = LockName {
            names: Arc::from(names.as_str()),
            hash_end,
        };
        if names.capacity() > KEPT_BUFFER {
            *names = String::new();
        }
        built
    }

    /// The key as the caller gave it (`order:42`).
    pub(crate) fn key(&self) -> &str {
        &self.names[self.hash_end..]
    }

    /// The lock's own key.
    pub(crate) fn hash(&self) -> &str {
        &self.names[..self.hash_end]
    }

    /// The name of the lock's counter of fencing tokens.
    pub(crate) fn fence(&self) -> String {
        self.companion(":fence")
    }

    /// Where releases are announced to every waiter (Redlock, memory).
    pub(crate) fn channel(&self) -> String {
        self.companion(":released")
    }

    /// The clients waiting for the lock, oldest first (one Redis, Sentinel, Cluster).
    pub(crate) fn queue(&self) -> String {
        self.companion(":queue")
    }

    /// Prefix of the channel on which each waiting client hears that it was passed
    /// the lock: the client's id follows.
    pub(crate) fn grants(&self) -> String {
        self.companion(":granted:")
    }

    /// Built when asked for, by the rarer ways: the everyday acquire and release name
    /// the lock alone.
    fn companion(&self, suffix: &str) -> String {
        let mut name = String::with_capacity(self.hash_end + suffix.len());
        name.push_str(self.hash());
        name.push_str(suffix);
        name
    }
}

/// The largest buffer a thread keeps for building names: a longer key's buffer goes
/// once its names are built.
const KEPT_BUFFER: usize = 4096;

thread_local! {
    static NAMES: RefCell<String> = const { RefCell::new(String::new()) };
}

/// The Cluster hash slot of a Redis key: CRC16 (XMODEM) of its hash tag, the text
/// between the first `{` and the next `}` if not empty, else of the whole key,
/// modulo 16384.
pub(crate) fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &bytes[open + 1..open + 1 + close])
    });
    let mut crc: u16 = 0;
    for &byte in tagged.unwrap_or(bytes) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_escaped_so_tuples_never_collide() {
        let a = LockKey::new("k").part("a:b").part("c");
        let b = LockKey::new("k").part("a").part("b:c");
        let c = LockKey::new("k").part("a\\").part(":c");
        let d = LockKey::new("k").part("a\\:").part("c");
        let keys = [&*a, &*b, &*c, &*d];
        for (i, x) in keys.iter().enumerate() {
            for y in &keys[i + 1..] {
                assert_ne!(x, y);
            }
        }
        assert_eq!(&*LockKey::new("a:b"), "a:b");
        assert_eq!(&*LockKey::new("a").part("b"), "a:b");
    }

    #[test]
    fn names_built_one_after_another_keep_their_own_key() {
        let long = "k{".repeat(KEPT_BUFFER);
        for key in [&long, "order:42", "é{x}%", "a"] {
            let name = LockName::new(key).unwrap();
            let escaped = key
                .replace('%', "%25")
                .replace('{', "%7B")
                .replace('}', "%7D");
            assert_eq!(name.hash(), format!("lock:{{{escaped}}}"));
            assert_eq!(name.key(), key);
            assert_eq!(name.queue(), format!("lock:{{{escaped}}}:queue"));
        }
    }

    #[test]
    fn braces_cannot_move_the_hash_tag() {
        let name = LockName::new("x}y{z%").unwrap();
        assert_eq!(name.hash(), "lock:{x%7Dy%7Bz%25}");
        assert_eq!(name.fence(), "lock:{x%7Dy%7Bz%25}:fence");
        assert_ne!(
            LockName::new("%7D").unwrap().hash(),
            LockName::new("}").unwrap().hash()
        );
    }

    #[test]
    fn empty_and_oversized_keys_are_rejected() {
        assert!(matches!(
            LockName::new(""),
            Err(LockError::InvalidKey { .. })
        ));
        assert!(LockName::new(&"k".repeat(MAX_KEY_LEN)).is_ok());
        assert!(matches!(
            LockName::new(&"k".repeat(MAX_KEY_LEN + 1)),
            Err(LockError::InvalidKey { .. })
        ));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Short text over `alphabet`, so that near-collisions come up often.
        fn text_of(alphabet: &[char]) -> impl Strategy<Value = String> + use<> {
            prop::collection::vec(prop::sample::select(alphabet.to_vec()), 0..6)
                .prop_map(|chars| chars.into_iter().collect())
        }

        /// The characters the part escaping cares about, and some that it does not.
        fn text() -> impl Strategy<Value = String> {
            prop_oneof![
                text_of(&['a', ':', '\\']),
                text_of(&['a', ':', '\\', '{', '}', '%', 'é', '锁', '🔒', ' ']),
            ]
        }

        /// The characters the hash tag encoding cares about.
        fn tag_text() -> impl Strategy<Value = String> {
            text_of(&['{', '}', '%', '7', 'B', 'D', '2', '5', ':'])
        }

        fn key(prefix: &str, parts: &[String]) -> LockKey {
            parts
                .iter()
                .fold(LockKey::new(prefix), |key, part| key.part(part))
        }

        /// The parts back from a key of `prefix`: a left inverse of `key`, which
        /// proves that distinct tuples give distinct keys.
        fn parts_of(key: &str, prefix: &str) -> Vec<String> {
            let mut parts = Vec::new();
            let mut chars = key.strip_prefix(prefix).unwrap().chars();
            while let Some(c) = chars.next() {
                match c {
                    ':' => parts.push(String::new()),
                    '\\' => parts.last_mut().unwrap().extend(chars.next()),
                    c => parts.last_mut().unwrap().push(c),
                }
            }
            parts
        }

        /// The key back from a lock's hash tag, undoing the percent-encoding.
        fn key_of_tag(hash: &str) -> String {
            let tag = hash
                .strip_prefix("lock:{")
                .unwrap()
                .strip_suffix('}')
                .unwrap();
            let mut key = String::new();
            let mut rest = tag;
            while let Some(at) = rest.find('%') {
                key.push_str(&rest[..at]);
                key.push(match &rest[at..at + 3] {
                    "%25" => '%',
                    "%7B" => '{',
                    "%7D" => '}',
                    other => panic!("`{other}` is not an encoding"),
                });
                rest = &rest[at + 3..];
            }
            key.push_str(rest);
            key
        }

        #[test]
        fn the_slot_function_matches_redis() {
            // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
            assert_eq!(slot("123456789"), 0x31C3);
            assert_eq!(slot("foo"), 12182);
            assert_eq!(slot("somekey"), 11058);
            assert_eq!(slot("foo{hash_tag}"), 2515);
            assert_eq!(slot("foo{}{bar}"), 8363, "an empty tag: the whole key");
            assert_eq!(slot("{user1000}.following"), slot("user1000"));
            assert_ne!(slot("foo{}{bar}"), slot("bar"));
        }

        proptest! {
            #[test]
            fn distinct_tuples_give_distinct_keys(
                prefix in text(),
                a in prop::collection::vec(text(), 0..4),
                b in prop::collection::vec(text(), 0..4),
            ) {
                prop_assume!(a != b);
                prop_assert_ne!(key(&prefix, &a), key(&prefix, &b));
                prop_assert_eq!(parts_of(&key(&prefix, &a), &prefix), a);
            }

            #[test]
            fn every_name_of_a_lock_shares_one_slot(
                prefix in prop_oneof![text(), tag_text()],
                parts in prop::collection::vec(prop_oneof![text(), tag_text()], 0..4),
            ) {
                let key = key(&prefix, &parts);
                prop_assume!(!key.is_empty());
                let name = LockName::new(&key).unwrap();
                let slot_of_lock = slot(name.hash());
                let grant = format!("{}{}", name.grants(), "client-7");
                for redis_name in [name.fence(), name.channel(), name.queue(), grant] {
                    prop_assert_eq!(slot(&redis_name), slot_of_lock, "{}", redis_name);
                }
            }

            #[test]
            fn distinct_keys_get_distinct_names(a in tag_text(), b in tag_text()) {
                prop_assume!(a != b && !a.is_empty() && !b.is_empty());
                let name = LockName::new(&a).unwrap();
                prop_assert_eq!(key_of_tag(name.hash()), a);
                let other = LockName::new(&b).unwrap();
                prop_assert_ne!(name.hash(), other.hash());
            }
        }
    }
}
