//! [`SortedIds`]: the ids a write-back takes and returns, in id order and each once, by
//! type.

use std::collections::HashSet;
use std::ops::Deref;

use super::MessageId;

/// Message ids in ascending order, each once. The write-backs of
/// [`Storage`](super::Storage) take them and return them: the relay builds them once,
/// where it calls storage (sorting what a client sent and dropping repeats), so no
/// backend sorts the ids it is given, and none can forget that a statement returns rows
/// (and locks them) in an order of the database's choosing: a backend answers with
/// [`SortedIds::only`] (the ids it was given that the database applied to, still in
/// order) or, for ids the database chose, builds new ones with [`SortedIds::from`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SortedIds(Vec<MessageId>);

impl SortedIds {
    pub fn as_slice(&self) -> &[MessageId] {
        &self.0
    }

    pub fn into_vec(self) -> Vec<MessageId> {
        self.0
    }

    /// Those of these ids that `applied` names (in any order, repeats allowed): still in
    /// order, each once, without sorting again.
    pub fn only(&self, applied: impl IntoIterator<Item = MessageId>) -> Self {
        let applied: HashSet<MessageId> = applied.into_iter().collect();
        Self(
            self.0
                .iter()
                .copied()
                .filter(|id| applied.contains(id))
                .collect(),
        )
    }
}

impl Deref for SortedIds {
    type Target = [MessageId];

    fn deref(&self) -> &[MessageId] {
        &self.0
    }
}

impl From<Vec<MessageId>> for SortedIds {
    fn from(mut ids: Vec<MessageId>) -> Self {
        ids.sort_unstable();
        ids.dedup();
        Self(ids)
    }
}

impl From<&[MessageId]> for SortedIds {
    fn from(ids: &[MessageId]) -> Self {
        ids.to_vec().into()
    }
}

impl<const N: usize> From<[MessageId; N]> for SortedIds {
    fn from(ids: [MessageId; N]) -> Self {
        Vec::from(ids).into()
    }
}

impl FromIterator<MessageId> for SortedIds {
    fn from_iter<I: IntoIterator<Item = MessageId>>(ids: I) -> Self {
        ids.into_iter().collect::<Vec<_>>().into()
    }
}

impl From<SortedIds> for Vec<MessageId> {
    fn from(ids: SortedIds) -> Self {
        ids.0
    }
}

impl<'a> IntoIterator for &'a SortedIds {
    type Item = &'a MessageId;
    type IntoIter = std::slice::Iter<'a, MessageId>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl IntoIterator for SortedIds {
    type Item = MessageId;
    type IntoIter = std::vec::IntoIter<MessageId>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl PartialEq<[MessageId]> for SortedIds {
    fn eq(&self, other: &[MessageId]) -> bool {
        self.0 == other
    }
}

impl PartialEq<Vec<MessageId>> for SortedIds {
    fn eq(&self, other: &Vec<MessageId>) -> bool {
        &self.0 == other
    }
}

impl<const N: usize> PartialEq<[MessageId; N]> for SortedIds {
    fn eq(&self, other: &[MessageId; N]) -> bool {
        self.0 == other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_order_each_once() {
        assert_eq!(SortedIds::from(vec![3, 1, 3, 2, 1]), [1, 2, 3]);
        assert_eq!(SortedIds::from([5, 4]), [4, 5]);
        assert!(SortedIds::default().is_empty());
    }

    #[test]
    fn only_keeps_the_applied_in_order() {
        let ids = SortedIds::from(vec![1, 2, 3, 4]);
        assert_eq!(ids.only([4, 2, 2, 9]), [2, 4]);
        assert!(ids.only([]).is_empty());
    }
}
