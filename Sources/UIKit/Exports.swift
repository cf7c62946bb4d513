// `import UIKit` on iOS brings Foundation, URLSession included: here Foundation and
// swift-corelibs-foundation's FoundationNetworking (URLSession's module on Linux).
@_exported import Foundation
@_exported import FoundationNetworking
