package rules

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/shoalnet/shoal/filter"
)

// ResolveRules turns the way an operator names rules into rule ids:
//
//	all                  every rule
//	7                    rule 7
//	198.18.0.100         every rule for that VIP
//	198.18.0.100:80      the rules covering port 80 of that VIP (tcp and udp
//	                     ones); a rule for every VIP counts only when no rule
//	                     names the VIP, as for packets
//	*:80                 the rules for every VIP covering port 80
//
// It fails with ErrUnknownRule when nothing matches.
func (s *State) ResolveRules(spec string) ([]filter.RuleID, error) {
	spec = strings.TrimSpace(spec)
	switch {
	case strings.EqualFold(spec, "all"):
		ids := make([]filter.RuleID, len(s.Rules))
		for i, r := range s.Rules {
			ids[i] = r.ID
		}
		if len(ids) == 0 {
			return nil, fmt.Errorf("%w: the cluster has no port rules", ErrUnknownRule)
		}
		return ids, nil
	case spec == "":
		return nil, fmt.Errorf("%w: no rule given; want all, a rule id, vip or vip:port", ErrInvalid)
	}
	if n, err := strconv.ParseUint(spec, 10, 32); err == nil {
		if s.Rule(filter.RuleID(n)) == nil {
			return nil, unknownRule(filter.RuleID(n))
		}
		return []filter.RuleID{filter.RuleID(n)}, nil
	}
	if vip, err := netip.ParseAddr(spec); err == nil {
		var ids []filter.RuleID
		for _, r := range s.Rules {
			if r.VIP == vip {
				ids = append(ids, r.ID)
			}
		}
		if len(ids) == 0 {
			return nil, fmt.Errorf("%w: no rule names vip %s", ErrUnknownRule, vip)
		}
		return ids, nil
	}
	host, port, err := splitHostPort(spec)
	if err != nil {
		return nil, fmt.Errorf("%w: rule %q: want all, a rule id, vip or vip:port", ErrInvalid, spec)
	}
	var vip netip.Addr // zero: rules for every VIP
	if host != "*" {
		if vip, err = netip.ParseAddr(host); err != nil {
			return nil, fmt.Errorf("%w: rule %q: %q is not an IP address or *", ErrInvalid, spec, host)
		}
	}
	match := func(want netip.Addr) []filter.RuleID {
		var ids []filter.RuleID
		for _, r := range s.Rules {
			if r.VIP == want && port >= r.PortLo && port <= r.PortHi {
				ids = append(ids, r.ID)
			}
		}
		return ids
	}
	ids := match(vip)
	if len(ids) == 0 && vip.IsValid() {
		ids = match(netip.Addr{})
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w: no rule covers %s", ErrUnknownRule, spec)
	}
	return ids, nil
}
