use std::fmt::{self, Display, Write};
use std::ops::Deref;

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
/// can move the tag.
#[derive(Debug, Clone)]
pub(crate) struct LockName {
    pub(crate) key: String,
    pub(crate) hash: String,
    pub(crate) fence: String,
    /// Where releases are announced to every waiter (Redlock, memory).
    pub(crate) channel: String,
    /// The clients waiting for the lock, oldest first (one Redis, Sentinel, Cluster).
    pub(crate) queue: String,
    /// Prefix of the channel on which each waiting client hears that it was passed
    /// the lock: the client's id follows.
    pub(crate) grants: String,
}

impl LockName {
    pub(crate) fn new(key: &str) -> Result<Self, LockError> {
        let reason = if key.is_empty() {
            "a key must not be empty; give the lock a prefix or a key part"
        } else if key.len() > MAX_KEY_LEN {
            "a key must be at most 64 KiB; derive a shorter key (an id or a hash) from the data"
        } else {
            let mut hash = String::with_capacity(key.len() + 16);
            hash.push_str("lock:{");
            for c in key.chars() {
                match c {
                    '%' => hash.push_str("%25"),
                    '{' => hash.push_str("%7B"),
                    '}' => hash.push_str("%7D"),
                    c => hash.push(c),
                }
            }
            hash.push('}');
            return Ok(LockName {
                key: key.to_owned(),
                fence: format!("{hash}:fence"),
                channel: format!("{hash}:released"),
                queue: format!("{hash}:queue"),
                grants: format!("{hash}:granted:"),
                hash,
            });
        };
        Err(LockError::InvalidKey {
            key: key.to_owned(),
            reason,
        })
    }
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
    fn braces_cannot_move_the_hash_tag() {
        let name = LockName::new("x}y{z%").unwrap();
        assert_eq!(name.hash, "lock:{x%7Dy%7Bz%25}");
        assert_eq!(name.fence, "lock:{x%7Dy%7Bz%25}:fence");
        assert_ne!(
            LockName::new("%7D").unwrap().hash,
            LockName::new("}").unwrap().hash
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
}
