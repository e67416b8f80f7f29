// Human-readable reports of the block table, for people reading a live allocator or a saved snapshot:
// the per-block stream table and the pending bytes per allocation stream. streamalloc_demo,
// the streamalloc_report tool and the C ABI's streamalloc_block_table() print them.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "streamalloc/blocks.hpp"

namespace streamalloc {

// Names to print instead of stream handles (e.g. {prefetch, "prefetch"}). A stream without a name is
// printed in hex, except 0, which is "default".
using StreamNames = std::map<Stream, std::string>;

// A title line, a column header, then one row per block of every segment, in the order given: address,
// size, state (free blocks marked "settled" or "own stream"), allocation stream, recorded streams,
// pending fences, age in ms. At most `max_rows` rows; a last line counts the blocks left out. When the
// segments span several devices, a "device N:" line precedes each device's rows. Ends with a newline.
std::string format_block_table(const std::vector<SegmentInfo>& segments, std::size_t max_rows,
                               const StreamNames& stream_names = {});

// Per allocation stream: pending blocks and bytes (freed, waiting for fences on the streams recorded on
// them), those streams, and the free bytes the stream owns that have not settled yet (safe for it alone);
// then a total, whose pending bytes are the devices' stats().pending_bytes.current summed. When the
// segments span several devices, a "device N:" line precedes each device's rows. One line when nothing is
// pending. Ends with a newline.
std::string format_pending_by_stream(const std::vector<SegmentInfo>& segments, const StreamNames& stream_names = {});

// format_block_table, an empty line, then format_pending_by_stream.
std::string format_block_report(const std::vector<SegmentInfo>& segments, std::size_t max_rows,
                                const StreamNames& stream_names = {});

// The segments of a snapshot: the inverse of Allocator::snapshot_json(). `json` is a snapshot object
// ({"segments": [...]}, as snapshot_json() and torch.cuda.memory._snapshot() write it) or a file written
// by the Python package's streamalloc.dump() (the snapshot under "snapshot"). Fields streamalloc adds to
// PyTorch's shape may be missing (PyTorch's own snapshots lack them) and read as zero/empty; a block's
// segment_address is its segment's address. Throws Error(kInvalidArgument) naming what is wrong and where
// ("segments[2].blocks[5].size: ...") for text that is not JSON, a missing or mistyped field, or an
// unknown block state.
std::vector<SegmentInfo> segments_from_snapshot_json(const std::string& json);

}  // namespace streamalloc
