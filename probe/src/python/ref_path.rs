//! The way from a frame to an object a look found: the names from a
//! module's namespace (`global app.trainer.loaders["train"]`) or from a
//! frame's slot (`local self.data.train_loader`), and what of each
//! object is looked through.

/// Most names from a namespace to an object whose attributes or items are
/// looked through: `app.fit.trainer` (then `app.fit.trainer.train_loader`
/// is found) or `app.trainer.loaders` (`app.trainer.loaders["train"]`).
const MAX_PATH: usize = 3;

/// The names from a frame's namespace to an object whose attributes or
/// items are looked through: the global's name, then each attribute's or
/// item's key, and which of the two it is.
#[derive(Clone, Copy)]
pub(super) struct Path {
    keys: [(u64, Inside); MAX_PATH],
    len: usize,
    /// From a frame's slot (`local holder.data`), not a namespace: one
    /// name only.
    from_local: bool,
}

impl Path {
    /// A global's.
    pub fn global(name: u64) -> Path {
        Path {
            keys: [(name, Inside::Namespace); MAX_PATH],
            len: 1,
            from_local: false,
        }
    }

    /// The attribute or item `key` of what a frame's slot holds (`inside`:
    /// which of the two).
    pub fn local(key: u64, inside: Inside) -> Path {
        Path {
            keys: [(key, inside); MAX_PATH],
            len: 1,
            from_local: true,
        }
    }

    /// This one and `key` after it, of what `inside` says; None past
    /// `MAX_PATH`, or past one name from a slot.
    pub fn then(self, key: u64, inside: Inside) -> Option<Path> {
        if self.from_local {
            return None;
        }
        let mut p = self;
        *p.keys.get_mut(p.len)? = (key, inside);
        p.len += 1;
        Some(p)
    }

    /// `global NAME.ATTR["ITEM"]`, or `SLOT.ATTR` from a slot named
    /// `slot`, each key named by `name`.
    pub fn named(&self, slot: impl Fn() -> String, name: impl Fn(u64) -> String) -> String {
        let mut out = if self.from_local {
            slot()
        } else {
            String::from("global")
        };
        for (i, &(key, inside)) in self.keys[..self.len].iter().enumerate() {
            out += &step(i == 0 && !self.from_local, &name(key), inside);
        }
        out
    }
}

/// How a key reads after what holds it: ` NAME` first in a path, `.NAME`
/// for an attribute, `["NAME"]` for an item.
pub(super) fn step(first: bool, name: &str, inside: Inside) -> String {
    match inside {
        _ if first => format!(" {name}"),
        Inside::Items => format!("[{name:?}]"),
        _ => format!(".{name}"),
    }
}

/// What of a slot's object is looked through.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Inside {
    /// Nothing (an int, a tuple, a function).
    Nothing,
    /// An instance's attributes: it is of a class.
    Attrs,
    /// A dict's items.
    Items,
    /// A frame's namespace's items (a module's globals).
    Namespace,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_names_attributes_and_items_and_ends_at_its_depth() {
        let names = |k: u64| ["app", "trainer", "loaders", "train"][k as usize].to_string();
        let p = Path::global(0)
            .then(1, Inside::Attrs)
            .and_then(|p| p.then(2, Inside::Attrs));
        let p = p.expect("three names fit");
        let slot = || "local self".to_string();
        assert_eq!(p.named(slot, names), "global app.trainer.loaders");
        assert_eq!(
            p.named(slot, names) + &step(false, &names(3), Inside::Items),
            r#"global app.trainer.loaders["train"]"#
        );
        // A fourth name would be looked through past MAX_PATH.
        assert!(p.then(3, Inside::Items).is_none());
        // From a slot: one name, then what it holds.
        let p = Path::local(1, Inside::Attrs);
        assert_eq!(
            p.named(slot, names) + &step(false, &names(2), Inside::Attrs),
            "local self.trainer.loaders"
        );
        assert!(p.then(2, Inside::Attrs).is_none());
    }
}
