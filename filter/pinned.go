package filter

// Pinned is what Pin returns beside the pins and LoadPinnedXDP needs to
// adopt them: which program they belong to and what the loader knew of its
// tables. It is JSON, for the caller to keep across the restart.
type Pinned struct {
	Program string                  `json:"program"` // programStamp of the pinning binary
	Mode    string                  `json:"mode"`    // an AttachMode
	Version uint32                  `json:"version"`
	Slots   map[RuleID]uint32       `json:"slots"`
	VIPDir  [tableVersions][]uint32 `json:"vip_dir"`
	VIP6Dir [tableVersions][]uint32 `json:"vip6_dir"` // the IPv6 VIP directory's entries in use
}
